-- Synchronising calls per rank and name: device runtime calls that block the calling host thread until the
-- device has finished (cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous cudaMemcpy, their HIP and
-- driver twins). The set is sync_calls (analyses/depgraph/model.py's SYNC_CALLS, bound by the caller): the
-- calls the dependency graph makes sync nodes of. Framework operators that cause them (aten::item,
-- aten::_local_scalar_dense) are not counted: the runtime call inside them is, once.
--
-- @column rank      global rank
-- @column name      the runtime call
-- @column calls     calls made
-- @column total_ns  time the host spent in them, ns
SELECT rank, name, count(*) AS calls, sum(dur_ns)::BIGINT AS total_ns
FROM runtime
WHERE list_contains($sync_calls, name) AND dur_ns IS NOT NULL AND ($rank IS NULL OR rank = $rank)
GROUP BY rank, name
ORDER BY rank, total_ns DESC, name
