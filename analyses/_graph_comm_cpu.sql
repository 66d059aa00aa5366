-- Private (depgraph.wide): of the graph's CPU events (_graph_cpu) those the collectives are made of: every c10d
-- call and every gloo / nccl annotation (a participant's call, its runloop's or its own annotation), for the
-- collective instances of ranks whose graph is not built. Columns as _graph_cpu's.
WITH cpu AS (
-- @include _graph_cpu
)
SELECT * FROM cpu WHERE name LIKE 'c10d::%' OR cat = 'user_annotation'
