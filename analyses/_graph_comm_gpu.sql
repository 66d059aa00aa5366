-- Private (depgraph.wide): of the graph's device ops (_graph_gpu) the given ones (a collective's kernels), for the
-- collective instances of ranks whose graph is not built. Columns as _graph_gpu's.
WITH gpu AS (
-- @include _graph_gpu
), ids AS (
    SELECT unnest($e_rank::BIGINT[]) AS rank, unnest($e_id::BIGINT[]) AS event_id
)
SELECT g.* FROM gpu g SEMI JOIN ids i ON g.rank = i.rank AND g.event_id = i.event_id
