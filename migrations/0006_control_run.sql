-- The run a conversation's control was made for: the steps its history carried then, and a
-- digest of them (with the task). A later request is subject to the control only when its
-- history continues that run, so that a new run under the same id (an agent that states
-- none is known by its system prompt and task) does not inherit a halt or a resume.
-- NULL: bound by the next request (an operator's halt or resume, made between requests).
ALTER TABLE conversation_controls ADD COLUMN run_steps INTEGER;
ALTER TABLE conversation_controls ADD COLUMN run_digest TEXT;
