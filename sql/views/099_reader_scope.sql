-- Runs after every view file (docs/ops.md, the reader role): the views' GRANTs to respool_reader name the
-- views a reader may read; they move to this database's own reader role
-- (respool.reader_role(), sql/functions/090_reader.sql), so respool_reader, which every
-- database of the server shares, keeps no privilege here.
SELECT respool.scope_reader_grants(p_record => true);
