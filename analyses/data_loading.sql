-- Data loading per rank: the host's time in data loading, from the CPU operators and annotations whose
-- name says so (DataLoader iteration, _next_data, data_loading / dataloader annotations). An annotation and
-- the operators inside it count once: the union of the matching spans (analyses/_islands.sql).
--
-- @column rank              global rank
-- @column spans             disjoint data-loading spans in the union (spans that only touch counted apart)
-- @column data_loading_ns   length of the union over the rank's whole trace, ns
WITH _layers AS (
  SELECT 'data_loading' AS layer, 'cpu' AS timeline, rank, NULL::BIGINT AS step, ts_ns, ts_ns + dur_ns AS end_ns
  FROM events
  WHERE cat IN ('cpu_op', 'user_annotation') AND dur_ns > 0
    AND regexp_matches(name, $data_loading_pattern)
    AND ($rank IS NULL OR rank = $rank)
),
-- @include _islands
_per_rank AS (
  SELECT rank, count(*) AS spans, sum(end_ns - start_ns)::BIGINT AS data_loading_ns FROM _islands GROUP BY rank
)
SELECT rank, spans, data_loading_ns FROM _per_rank ORDER BY rank
