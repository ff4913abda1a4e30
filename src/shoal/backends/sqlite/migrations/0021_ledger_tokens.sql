-- shoal schema version 21: what a priced provider call spent on, in the cost ledger.
--
-- A ledger row written by a provider call keeps the provider's name and the tokens the call
-- reported using (call.used(tokens=...)), so the ledger shows every model call with its tokens
-- beside its cost. Rows of other spending (ctx.spend, app.spend), and rows written before this
-- migration, leave both NULL.

ALTER TABLE cost_ledger ADD COLUMN provider TEXT;
ALTER TABLE cost_ledger ADD COLUMN tokens INTEGER;
