-- 0031_preempt_note: a victim in its grace period keeps the parts of its status message as data.
-- Its message says why it was preempted and until when it may release ("…; release within
-- 30 s"); the first part is kept here, so that what it says once the grace period ends is built
-- from that part, never by editing the finished sentence.
ALTER TABLE respool.requests ADD COLUMN preempt_note text;
COMMENT ON COLUMN respool.requests.preempt_note IS
    'While preempting after a terminate (docs/preemption.md, "Terminate"): the admin''s message, without the release hint the status message adds; the message at the end of the grace period is built from it. NULL otherwise.';
