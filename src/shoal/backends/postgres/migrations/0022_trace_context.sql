-- shoal schema version 22: the trace a run and an outbox entry continue (OpenTelemetry).
--
-- trace_context is the W3C trace context active where the run was dispatched (for an outbox
-- entry: where its step ran), as the propagator's carrier in JSON ({"traceparent": ...,
-- "tracestate": ...}), written once with the row; the attempts of the run and the deliveries of
-- the entry are traced as its children. NULL when nothing was traced there (tracing off, no span
-- active, a cron tick) and for rows written before this version.

ALTER TABLE runs ADD COLUMN trace_context text;
ALTER TABLE outbox ADD COLUMN trace_context text;
