-- What each answer cost (`crate::budget`). The token columns now split the input by how it
-- is billed, in the same terms for every API (`crate::budget::Usage`): `input_tokens` is
-- the input neither read from nor written to the prompt cache (OpenAI's and Gemini's
-- prompt counts include their cache reads; here they are taken out), `cached_input_tokens`
-- the input read from it, `cache_write_tokens` the input written to it (Anthropic), and
-- `output_tokens` all output, Gemini's thoughts included. Rows written before this
-- migration hold the API's own counts.
-- `cost_usd`: the answer's price in US dollars; NULL when its usage or its model's price
-- is unknown (such a model's answers count as free: the process log names it once).
-- At start the proxy sums the last day of them per conversation, so that budgets survive a
-- restart.
ALTER TABLE requests ADD COLUMN cached_input_tokens INTEGER;
ALTER TABLE requests ADD COLUMN cache_write_tokens INTEGER;
ALTER TABLE requests ADD COLUMN cost_usd REAL;
