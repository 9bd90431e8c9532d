-- Nodes (sql/functions/052_nodes.sql); each returns the node as JSON (list_nodes: an array).

-- create_node --
-- Register a node from a NodeCreate body; returns node_json.
SELECT respool.create_node(p_body => $1);

-- update_node --
-- Update a node by name from a NodeUpdate body; $3 true preempts what a move out of its pool displaces.
SELECT respool.update_node(p_name => $1, p_body => $2, p_force => $3);

-- delete_node --
-- Delete a node by name; $2 true preempts its allocations instead of refusing.
SELECT respool.delete_node(p_name => $1, p_force => $2);

-- set_node_state --
-- cordon (cordoned), drain (draining) or uncordon (active) a node by name; returns node_json.
SELECT respool.set_node_state(p_name => $1, p_state => $2);

-- get_node --
-- One node by name (RP404 when there is none).
SELECT respool.get_node(p_name => $1);

-- list_nodes --
-- Nodes by name, of one pool ($1 a ref, NULL: all) matching every label of the selector $2.
SELECT respool.list_nodes(p_pool => $1, p_selector => $2);
