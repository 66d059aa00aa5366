-- Collectives per rank: the private views every communication analysis reads (the graph reads the public
-- comm_participants.sql built on them). Installed as TEMP objects on a run's connection by
-- analyses.comms.prepare_views, after it has written the
-- TEMP table _comm_clock_offsets(rank, clock_offset_ns) (zeros unless the caller asked for aligned times).
-- One statement per ';' at a line end.

-- _comm_op(name): canonical collective op of a c10d op, NCCL/gloo annotation, coll_name or kernel name.
-- Order matters: all_reduce before reduce, reduce_scatter before scatter, all_gather before gather.
-- (k: the name lower-cased without underscores, computed once by _comm_op)
CREATE OR REPLACE TEMP MACRO _comm_op_of(k) AS (
  CASE
    WHEN k IS NULL THEN NULL
    WHEN contains(k, 'allreduce') THEN 'all_reduce'
    WHEN contains(k, 'reducescatter') THEN 'reduce_scatter'
    WHEN contains(k, 'allgather') THEN 'all_gather'
    WHEN contains(k, 'alltoall') THEN 'all_to_all'
    WHEN contains(k, 'broadcast') THEN 'broadcast'
    WHEN contains(k, 'sendrecv') THEN 'send_recv'
    WHEN contains(k, 'barrier') THEN 'barrier'
    WHEN contains(k, 'reduce') THEN 'reduce'
    WHEN contains(k, 'gather') THEN 'gather'
    WHEN contains(k, 'scatter') THEN 'scatter'
    WHEN contains(k, 'send') THEN 'send'
    WHEN contains(k, 'recv') THEN 'recv'
  END
);
CREATE OR REPLACE TEMP MACRO _comm_op(n) AS (_comm_op_of(replace(lower(n), '_', '')));

-- _comm_moved_nelems(op, in_nelems, out_nelems): the elements an op moves in total, nccl-tests convention
-- (all_gather: its output; reduce_scatter: its input; otherwise the input).
CREATE OR REPLACE TEMP MACRO _comm_moved_nelems(op, i, o) AS (
  CASE WHEN op IN ('all_gather', 'reduce_scatter', 'all_to_all') THEN greatest(i, coalesce(o, i)) ELSE i END
);

-- shapes and element sizes of operator arguments: _tensor_dtype_bytes, _tensor_arg_nelems, _tensor_first_type
-- @include _tensor_args

-- _comm_kernel_dtype(name): the dtype NCCL writes into a kernel name (ncclDevKernel_AllReduce_Sum_f16_RING_LL,
-- ncclKernel_AllReduce_RING_LL_Sum_float); NULL for byte-oriented kernels (AllGather) that carry none.
CREATE OR REPLACE TEMP MACRO _comm_kernel_dtype(n) AS (
  nullif(regexp_extract(n, '_(bf16|f16|f32|f64|f8e4m3|f8e5m2|i8|u8|i32|u32|i64|u64|float|half|double|int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t)(_|\(|$)', 1), '')
);

-- Process groups. A collective row names its group by pg_id, a key of _comm_groups (one row per distinct member
-- list), never by the list itself: a list of the group's ranks on every row is group size x rows integers, which
-- is world_size^2 for a group of all (10 GB of 16,384 ranks' collectives).
--
-- _comm_config_groups: each process group of each distinct pg_config list of the ranks' distributedInfo, parsed
-- once (every rank's list names each group's members, so the ranks' documents hold world_size^2 numbers: parsed
-- per rank, 4,096 ranks took 5 s here); _comm_rank_pg: each rank's list.
CREATE OR REPLACE TEMP TABLE _comm_rank_pg AS
SELECT rank, world_size, backend, json_extract(distributed_info_json, '$.pg_config')::VARCHAR AS pg_config
FROM ranks;

CREATE OR REPLACE TEMP TABLE _comm_config_groups AS
SELECT pg_config, n_pg, json_extract_string(p, '$.pg_name') AS pg_name, json_extract_string(p, '$.pg_desc') AS pg_desc,
       TRY_CAST(json_extract(p, '$.ranks')::VARCHAR AS BIGINT[]) AS pg_ranks
FROM (SELECT pg_config, json_array_length(pg_config) AS n_pg, unnest(json_extract(pg_config, '$[*]')) AS p
      FROM (SELECT DISTINCT pg_config FROM _comm_rank_pg) WHERE json_array_length(pg_config) > 0);

-- _comm_cpu_events: the CPU events the views below read (c10d calls, record_param_comms, nccl:* / gloo:*
-- annotations), from one scan of the events (each statement scanned them all: 3 s of 4,096 ranks' views), with
-- their step as cpu_ops gives it.
CREATE OR REPLACE TEMP TABLE _comm_cpu_events AS
SELECT e.*, CASE WHEN e.ts_ns < s.step_end_ns THEN s.step END AS step
FROM (SELECT * FROM events
      WHERE ph = 'X' AND (cat = 'cpu_op' AND (starts_with(name, 'c10d::') OR name = 'record_param_comms')
                          OR cat = 'user_annotation' AND (starts_with(name, 'nccl:') OR starts_with(name, 'gloo:')))) e
ASOF LEFT JOIN _step_spans s ON e.rank = s.rank AND e.ts_ns >= s.step_start_ns;

-- _comm_calls: CPU-side collective calls: outermost c10d::* ops of a known op, and record_param_comms events
-- with collective metadata that no c10d op encloses (older NCCL builds record only those).
CREATE OR REPLACE TEMP TABLE _comm_calls AS
WITH c10d AS (
  SELECT rank, event_id, name, pid, tid, ts_ns, end_ns, step, input_dims, input_types, concrete_inputs
  FROM _comm_cpu_events WHERE cat = 'cpu_op' AND name LIKE 'c10d::%' AND _comm_op(name) IS NOT NULL
),
rpc AS (
  SELECT rank, event_id, name, pid, tid, ts_ns, end_ns, step, input_dims, input_types, coll_name, coll_dtype,
         in_msg_nelems, out_msg_nelems, group_size, pg_name, pg_desc, pg_ranks, seq, comms_id
  FROM _comm_cpu_events WHERE cat = 'cpu_op' AND name = 'record_param_comms' AND _comm_op(coll_name) IS NOT NULL  -- not 'wait'
),
outer_c10d AS (
  SELECT c.* FROM c10d c
  WHERE NOT EXISTS (SELECT 1 FROM c10d o WHERE o.rank = c.rank AND o.tid = c.tid AND o.event_id <> c.event_id
                    AND o.ts_ns <= c.ts_ns AND o.end_ns >= c.end_ns AND (o.ts_ns < c.ts_ns OR o.end_ns > c.end_ns
                    OR o.event_id < c.event_id))
),
with_meta AS (
  SELECT c.*, r.coll_name, r.coll_dtype, r.in_msg_nelems, r.out_msg_nelems, r.group_size, r.pg_name, r.pg_desc,
         r.pg_ranks, r.seq, r.comms_id,
         row_number() OVER (PARTITION BY c.rank, c.event_id ORDER BY r.ts_ns NULLS LAST) AS k
  FROM outer_c10d c
  LEFT JOIN rpc r ON r.rank = c.rank AND r.tid = c.tid AND r.ts_ns >= c.ts_ns AND r.ts_ns < c.end_ns
)
SELECT * EXCLUDE (k) FROM with_meta WHERE k = 1
UNION ALL BY NAME
SELECT r.* FROM rpc r
WHERE NOT EXISTS (SELECT 1 FROM outer_c10d c WHERE c.rank = r.rank AND c.tid = r.tid
                  AND r.ts_ns >= c.ts_ns AND r.ts_ns < c.end_ns);

-- _comm_kernels: the collective libraries' kernels (NCCL, RCCL, ...: comm_kernel_pattern, kernel_classes.py's
-- COMM_KERNEL_PATTERN, bound by analyses/comms.py), with their launch (gpu_ops joins launch and op on correlation).
CREATE OR REPLACE TEMP TABLE _comm_kernels AS
SELECT rank, event_id, name, ts_ns, end_ns, launch_ts_ns, launch_tid, step, stream, coll_name, coll_dtype,
       in_msg_nelems, out_msg_nelems, group_size, pg_name, pg_desc, pg_ranks, seq, comms_id
FROM kernels WHERE regexp_matches(name, $comm_kernel_pattern);

-- _comm_group_texts_raw: the member lists the collective metadata spells out, each once.
CREATE OR REPLACE TEMP TABLE _comm_group_texts_raw AS
SELECT DISTINCT pg_ranks AS pg_ranks_text
FROM (SELECT pg_ranks FROM _comm_calls UNION ALL SELECT pg_ranks FROM _comm_kernels) WHERE pg_ranks IS NOT NULL;

-- _comm_groups: every member list a collective can name, once: distributedInfo's groups, the world of each
-- world size (ranks 0..world_size-1), and the lists the collective metadata spells out (record_param_comms', a
-- kernel's Process Group Ranks). pg_id: the list's place in sort order; n_ranks: its length.
CREATE OR REPLACE TEMP TABLE _comm_groups AS
SELECT row_number() OVER (ORDER BY pg_ranks) AS pg_id, len(pg_ranks) AS n_ranks, pg_ranks
FROM (SELECT DISTINCT pg_ranks FROM (
  SELECT pg_ranks FROM _comm_config_groups
  UNION ALL SELECT range(0, coalesce(world_size, 0)) FROM (SELECT DISTINCT world_size FROM _comm_rank_pg)
  UNION ALL SELECT TRY_CAST(pg_ranks_text AS BIGINT[]) FROM _comm_group_texts_raw
) WHERE pg_ranks IS NOT NULL);

-- _comm_group_texts: the pg_id of each spelled-out list; _comm_group_members: each group's members by place (idx
-- 0 is the group's rank 0), for a group-local peer's global rank.
CREATE OR REPLACE TEMP TABLE _comm_group_texts AS
SELECT t.pg_ranks_text, g.pg_id
FROM _comm_group_texts_raw t JOIN _comm_groups g ON g.pg_ranks = TRY_CAST(t.pg_ranks_text AS BIGINT[]);

CREATE OR REPLACE TEMP TABLE _comm_group_members AS
SELECT pg_id, generate_subscripts(pg_ranks, 1) - 1 AS idx, unnest(pg_ranks) AS member FROM _comm_groups;

-- _comm_pg_config: every process group distributedInfo lists for a rank (the groups the rank belongs to): a
-- collective whose metadata names only its group (the flight recorder, a p2p call's group-local peer) takes
-- the group's members from here. n_pg: how many groups the rank's list names.
CREATE OR REPLACE TEMP TABLE _comm_pg_config AS
SELECT r.rank, c.n_pg, c.pg_name, c.pg_desc, c.pg_id
FROM _comm_rank_pg r
JOIN (SELECT cg.pg_config, cg.n_pg, cg.pg_name, cg.pg_desc, g.pg_id
      FROM _comm_config_groups cg LEFT JOIN _comm_groups g ON g.pg_ranks = cg.pg_ranks) c ON c.pg_config = r.pg_config;

-- _comm_rank_groups: per rank, the single process group distributedInfo names (when it names exactly one),
-- else the whole world (ranks 0..world_size-1) as an assumption, said so in pg_source.
CREATE OR REPLACE TEMP TABLE _comm_rank_groups AS
SELECT r.rank, r.world_size, r.backend, p.pg_name, p.pg_desc,
       CASE WHEN p.n_pg = 1 THEN p.pg_id ELSE w.pg_id END AS pg_id,
       CASE WHEN p.n_pg = 1 THEN 'distributedInfo' ELSE 'world' END AS pg_source
FROM _comm_rank_pg r
LEFT JOIN _comm_pg_config p ON p.rank = r.rank AND p.n_pg = 1
LEFT JOIN (SELECT w.world_size, g.pg_id FROM (SELECT DISTINCT world_size FROM _comm_rank_pg) w
           JOIN _comm_groups g ON g.pg_ranks = range(0, coalesce(w.world_size, 0))) w
  ON w.world_size IS NOT DISTINCT FROM r.world_size;

-- _comm_fr_calls: the flight-recorder entry each call created (its time_created_ns falls inside the call, on the
-- same host clock): the process group and its per-group sequence number, which gloo's trace events do not carry
-- (a rank in several groups, a 2-D mesh, would otherwise have every collective matched as the world's). The
-- recorder lists collectives only (gloo's send and recv are not in it).
CREATE OR REPLACE TEMP TABLE _comm_fr_calls AS
SELECT * EXCLUDE (k) FROM (
  SELECT c.rank, c.event_id AS call_event_id, f.pg_name, f.pg_desc, f.collective_seq_id,
         row_number() OVER (PARTITION BY c.rank, c.event_id ORDER BY f.time_created_ns, f.record_id) AS k
  FROM _comm_calls c JOIN fr_entries f
    ON f.rank = c.rank AND NOT coalesce(f.is_p2p, false) AND f.collective_seq_id IS NOT NULL
   AND f.time_created_ns BETWEEN c.ts_ns AND c.end_ns
) WHERE k = 1;

-- _comm_p2p_calls: c10d::send(tensors, group, dstRank, tag) / c10d::recv_(tensors, group, srcRank, tag) with the
-- peer (a rank of the call's group, group-local) and the tag from the call's Concrete Inputs.
CREATE OR REPLACE TEMP TABLE _comm_p2p_calls AS
SELECT rank, event_id, _comm_op(name) AS op, TRY_CAST(json_extract_string(concrete_inputs, '$[2]') AS BIGINT) AS peer,
       TRY_CAST(json_extract_string(concrete_inputs, '$[3]') AS BIGINT) AS tag
FROM _comm_calls WHERE _comm_op(name) IN ('send', 'recv');

-- _comm_p2p_groups: the group of each p2p call whose metadata names none. Of the rank's groups, those in which
-- the peer-th member has a call of the opposite direction, with the same tag, naming this rank as its peer in
-- that same group; the smallest such group (then the lowest name). A pipeline stage's send to group-local rank 1
-- means global rank 3 in its stage group [2, 3] but rank 1 in the world: only the first has a matching recv.
CREATE OR REPLACE TEMP TABLE _comm_p2p_groups AS
WITH ends AS (SELECT DISTINCT rank, op, peer, tag FROM _comm_p2p_calls WHERE peer IS NOT NULL),
-- a rank's groups with their peer-th member
peers AS (
  SELECT e.rank, e.op, e.peer, e.tag, g.pg_name, g.pg_id, m.member AS peer_rank
  FROM ends e JOIN _comm_pg_config g ON g.rank = e.rank
  JOIN _comm_group_members m ON m.pg_id = g.pg_id AND m.idx = e.peer
),
cand AS (SELECT * FROM peers WHERE peer_rank <> rank),
ok AS (
  SELECT c.* FROM cand c
  WHERE EXISTS (SELECT 1 FROM peers o WHERE o.rank = c.peer_rank AND o.pg_name = c.pg_name AND o.op <> c.op
                  AND o.tag IS NOT DISTINCT FROM c.tag AND o.peer_rank = c.rank)
)
SELECT o.rank, o.op, o.peer, o.tag, arg_min(o.pg_name, (g.n_ranks, o.pg_name)) AS pg_name,
       arg_min(o.pg_id, (g.n_ranks, o.pg_name)) AS pg_id
FROM ok o JOIN _comm_groups g USING (pg_id) GROUP BY o.rank, o.op, o.peer, o.tag;

-- _comm_call_kernels: the kernels each call launched (launch on the call's thread, inside its span).
CREATE OR REPLACE TEMP TABLE _comm_call_kernels AS
SELECT c.rank, c.event_id AS call_event_id, k.*  EXCLUDE (rank)
FROM _comm_calls c JOIN _comm_kernels k
  ON k.rank = c.rank AND k.launch_tid = c.tid AND k.launch_ts_ns >= c.ts_ns AND k.launch_ts_ns <= c.end_ns;

-- _comm_annotations: nccl:* / gloo:* annotations. NCCL's sit inside the call on its thread; gloo's sit on
-- the pt_gloo_runloop thread and share no id with the call, so they are paired by order (below).
CREATE OR REPLACE TEMP TABLE _comm_annotations AS
SELECT rank, event_id, name, tid, ts_ns, end_ns, input_dims, input_types, _comm_op(name) AS op
FROM _comm_cpu_events WHERE cat = 'user_annotation' AND (name LIKE 'nccl:%' OR name LIKE 'gloo:%')
  AND _comm_op(name) IS NOT NULL;

CREATE OR REPLACE TEMP TABLE _comm_nested_annotations AS
SELECT * FROM (
  SELECT c.rank, c.event_id AS call_event_id, a.event_id, a.name, a.ts_ns, a.end_ns, a.input_dims, a.input_types,
         row_number() OVER (PARTITION BY c.rank, c.event_id ORDER BY a.ts_ns) AS k
  FROM _comm_calls c JOIN _comm_annotations a
    ON a.rank = c.rank AND a.tid = c.tid AND a.ts_ns >= c.ts_ns AND a.ts_ns <= c.end_ns
) WHERE k = 1;

-- gloo pairing: a call's work runs on the group's runloop threads in the order the calls enqueued it, and the
-- annotation there names what the backend ran (gloo runs a reduce-scatter as an all-reduce of the whole input:
-- gloo:all_reduce after c10d::_reduce_scatter_base_), so calls and loose annotations are paired by the buffer the
-- work moves: the n-th unpaired call of a rank whose input holds N elements <-> the n-th loose annotation of the
-- rank over N elements (a call's input: Input Dims' second argument for (output, input) ops, the first for the
-- others; the annotation's first). Calls or annotations without dims are paired by op, as before. Only
-- annotations that start after the rank's first such call count (a trace window can open while the runloop still
-- runs a collective whose call fell before the window).
CREATE OR REPLACE TEMP TABLE _comm_loose_pairs AS
WITH calls AS (
  SELECT c.rank, c.event_id, _comm_op(c.name) AS op, c.ts_ns,
         CASE WHEN regexp_matches(c.name, '_base_$|allgather|reduce_scatter|alltoall|gather_|scatter_')
              THEN _tensor_arg_nelems(c.input_dims, 1) ELSE _tensor_arg_nelems(c.input_dims, 0) END AS nelems
  FROM _comm_calls c
  WHERE c.name LIKE 'c10d::%'
    AND NOT EXISTS (SELECT 1 FROM _comm_call_kernels k WHERE k.rank = c.rank AND k.call_event_id = c.event_id)
    AND NOT EXISTS (SELECT 1 FROM _comm_nested_annotations a WHERE a.rank = c.rank AND a.call_event_id = c.event_id)
),
loose AS (
  SELECT a.*, _tensor_arg_nelems(a.input_dims, 0) AS nelems FROM _comm_annotations a
  WHERE NOT EXISTS (SELECT 1 FROM _comm_nested_annotations x WHERE x.rank = a.rank AND x.event_id = a.event_id)
),
by_size AS (
  SELECT c.rank, c.event_id AS call_event_id, l.event_id
  FROM (SELECT *, row_number() OVER (PARTITION BY rank, nelems ORDER BY ts_ns, event_id) AS n
        FROM calls WHERE nelems IS NOT NULL) c
  JOIN (SELECT l.*, row_number() OVER (PARTITION BY l.rank, l.nelems ORDER BY l.ts_ns, l.event_id) AS n
        FROM loose l
        WHERE l.nelems IS NOT NULL
          AND l.ts_ns >= (SELECT min(c.ts_ns) FROM calls c WHERE c.rank = l.rank AND c.nelems = l.nelems)) l
    ON l.rank = c.rank AND l.nelems = c.nelems AND l.n = c.n
),
rest_calls AS (
  SELECT c.*, row_number() OVER (PARTITION BY c.rank, c.op ORDER BY c.ts_ns, c.event_id) AS n FROM calls c
  WHERE NOT EXISTS (SELECT 1 FROM by_size b WHERE b.rank = c.rank AND b.call_event_id = c.event_id)
),
rest_loose AS (
  SELECT l.*, row_number() OVER (PARTITION BY l.rank, l.op ORDER BY l.ts_ns, l.event_id) AS n FROM loose l
  WHERE NOT EXISTS (SELECT 1 FROM by_size b WHERE b.rank = l.rank AND b.event_id = l.event_id)
    AND l.ts_ns >= (SELECT min(c.ts_ns) FROM rest_calls c WHERE c.rank = l.rank AND c.op = l.op)
),
pairs AS (
  SELECT * FROM by_size
  UNION ALL
  SELECT c.rank, c.event_id, l.event_id FROM rest_calls c JOIN rest_loose l ON l.rank = c.rank AND l.op = c.op AND l.n = c.n
)
SELECT p.rank, p.call_event_id, a.event_id, a.name, a.tid, a.ts_ns, a.end_ns, a.input_dims, a.input_types
FROM pairs p JOIN _comm_annotations a ON a.rank = p.rank AND a.event_id = p.event_id;

-- _comm_rows_raw: one row per (rank, collective) on the trace clocks, before any clock correction.
CREATE OR REPLACE TEMP TABLE _comm_rows_raw AS
WITH kagg AS (
  SELECT rank, call_event_id, count(*) AS kernel_count, arg_min(name, ts_ns) AS kernel_name,
         arg_min(event_id, ts_ns) AS kernel_event_id, min(ts_ns) AS kernel_start_ns, max(end_ns) AS kernel_end_ns,
         arg_min(coll_name, ts_ns) AS coll_name, arg_min(coll_dtype, ts_ns) AS coll_dtype,
         arg_min(in_msg_nelems, ts_ns) AS in_msg_nelems, arg_min(out_msg_nelems, ts_ns) AS out_msg_nelems,
         arg_min(group_size, ts_ns) AS group_size, arg_min(pg_name, ts_ns) AS pg_name, arg_min(pg_desc, ts_ns) AS pg_desc,
         arg_min(pg_ranks, ts_ns) AS pg_ranks, arg_min(seq, ts_ns) AS seq, arg_min(comms_id, ts_ns) AS comms_id
  FROM _comm_call_kernels GROUP BY rank, call_event_id
),
from_calls AS (
  SELECT c.rank, c.step, c.name AS cpu_name, c.event_id AS cpu_event_id, c.tid AS cpu_tid,
         c.ts_ns AS cpu_start_ns, c.end_ns AS cpu_end_ns,
         k.kernel_name, k.kernel_event_id, coalesce(k.kernel_count, 0) AS kernel_count,
         k.kernel_start_ns, k.kernel_end_ns,
         coalesce(n.name, p.name) AS annotation_name, p.tid AS runloop_tid,
         p.ts_ns AS runloop_start_ns, p.end_ns AS runloop_end_ns,
         -- a send's or recv's own annotation, when it outlasts the call: the message had gone (come) then
         CASE WHEN n.name LIKE 'gloo:%' AND n.end_ns > c.end_ns THEN n.end_ns END AS nested_end_ns,
         coalesce(c.coll_name, k.coll_name) AS coll_name,
         -- the dtype: the metadata's, else the element type the annotation or the call itself records (FSDP's
         -- _allgather_base_ / _reduce_scatter_base_ calls carry their tensors' types)
         coalesce(c.coll_dtype, k.coll_dtype, _tensor_first_type(coalesce(n.input_types, p.input_types)),
                  _tensor_first_type(c.input_types),
                  _comm_kernel_dtype(k.kernel_name)) AS dtype,
         -- the size, from every place the trace keeps it: the collective metadata (record_param_comms, the
         -- kernel), the call's Input Dims, else the nccl:* / gloo:* annotation's (DDP's all_reduce takes a
         -- TensorList, which older builds record with empty Input Dims; the annotation has the flat buffer)
         coalesce(c.in_msg_nelems, k.in_msg_nelems, _tensor_arg_nelems(c.input_dims, 0),
                  _tensor_arg_nelems(coalesce(n.input_dims, p.input_dims), 0)) AS in_nelems,
         coalesce(c.out_msg_nelems, k.out_msg_nelems, _tensor_arg_nelems(c.input_dims, 1)) AS out_nelems,
         CASE WHEN coalesce(c.in_msg_nelems, k.in_msg_nelems) IS NOT NULL THEN 'args'
              WHEN _tensor_arg_nelems(c.input_dims, 0) IS NOT NULL THEN 'input_dims'
              WHEN _tensor_arg_nelems(coalesce(n.input_dims, p.input_dims), 0) IS NOT NULL THEN 'annotation' END
           AS size_source,
         coalesce(c.group_size, k.group_size) AS group_size,
         -- the group: the collective metadata's, else the flight recorder's (gloo), else a p2p call's resolved one
         coalesce(c.pg_name, k.pg_name, fr.pg_name, pg.pg_name) AS pg_name,
         coalesce(c.pg_desc, k.pg_desc, fr.pg_desc) AS pg_desc,
         coalesce(c.pg_ranks, k.pg_ranks) AS pg_ranks_text, pg.pg_id AS p2p_pg_id,
         coalesce(c.seq, k.seq, fr.collective_seq_id) AS seq, coalesce(c.comms_id, k.comms_id) AS comms_id,
         pp.peer AS p2p_peer, pp.tag AS p2p_tag,
         -- what the backend ran, where the runloop's annotation says (gloo:all_reduce for a reduce-scatter call),
         -- and the elements of its buffer: the collective the network carried
         _comm_op(p.name) AS run_op, _tensor_arg_nelems(p.input_dims, 0) AS run_nelems
  FROM _comm_calls c
  LEFT JOIN kagg k ON k.rank = c.rank AND k.call_event_id = c.event_id
  LEFT JOIN _comm_nested_annotations n ON n.rank = c.rank AND n.call_event_id = c.event_id
  LEFT JOIN _comm_loose_pairs p ON p.rank = c.rank AND p.call_event_id = c.event_id
  LEFT JOIN _comm_fr_calls fr ON fr.rank = c.rank AND fr.call_event_id = c.event_id
  LEFT JOIN _comm_p2p_calls pp ON pp.rank = c.rank AND pp.event_id = c.event_id
  LEFT JOIN _comm_p2p_groups pg ON pg.rank = pp.rank AND pg.op = pp.op AND pg.peer = pp.peer
                               AND pg.tag IS NOT DISTINCT FROM pp.tag
),
-- kernels no call launched (a trace without CPU ops, or a launch outside any c10d op): their own rows
from_kernels AS (
  SELECT k.rank, k.step, NULL AS cpu_name, NULL::BIGINT AS cpu_event_id, NULL::BIGINT AS cpu_tid,
         NULL::BIGINT AS cpu_start_ns, NULL::BIGINT AS cpu_end_ns, k.name AS kernel_name, k.event_id AS kernel_event_id,
         1 AS kernel_count, k.ts_ns AS kernel_start_ns, k.end_ns AS kernel_end_ns, NULL AS annotation_name,
         NULL::BIGINT AS runloop_tid, NULL::BIGINT AS runloop_start_ns, NULL::BIGINT AS runloop_end_ns,
         NULL::BIGINT AS nested_end_ns,
         k.coll_name, coalesce(k.coll_dtype, _comm_kernel_dtype(k.name)) AS dtype, k.in_msg_nelems AS in_nelems,
         k.out_msg_nelems AS out_nelems, CASE WHEN k.in_msg_nelems IS NOT NULL THEN 'args' END AS size_source,
         k.group_size, k.pg_name, k.pg_desc, k.pg_ranks AS pg_ranks_text, NULL::BIGINT AS p2p_pg_id, k.seq, k.comms_id,
         NULL::BIGINT AS p2p_peer, NULL::BIGINT AS p2p_tag, NULL AS run_op, NULL::BIGINT AS run_nelems
  FROM _comm_kernels k
  WHERE NOT EXISTS (SELECT 1 FROM _comm_call_kernels x WHERE x.rank = k.rank AND x.event_id = k.event_id)
),
rows AS (SELECT * FROM from_calls UNION ALL BY NAME SELECT * FROM from_kernels),
-- ranks that ran collectives on a GPU: a call of theirs without a kernel had its kernel outside the window
gpu_ranks AS (SELECT DISTINCT rank FROM _comm_kernels),
typed AS (
  SELECT r.*,
         coalesce(_comm_op(r.coll_name), _comm_op(r.cpu_name), _comm_op(r.annotation_name), _comm_op(r.kernel_name)) AS op,
         _tensor_dtype_bytes(r.dtype) AS elem_bytes,
         coalesce(r.pg_name, g.pg_name) AS group_name,
         coalesce(r.pg_desc, pc.pg_desc, g.pg_desc) AS group_desc,
         coalesce(tx.pg_id, r.p2p_pg_id, pc.pg_id, g.pg_id) AS group_id,
         CASE WHEN r.pg_name IS NOT NULL OR r.pg_ranks_text IS NOT NULL OR r.p2p_pg_id IS NOT NULL THEN 'args'
              ELSE g.pg_source END AS pg_source,
         CASE WHEN r.kernel_start_ns IS NOT NULL THEN 'gpu'
              WHEN r.rank IN (SELECT rank FROM gpu_ranks) THEN 'none'
              ELSE 'cpu' END AS timeline
  FROM rows r LEFT JOIN _comm_rank_groups g ON g.rank = r.rank
  LEFT JOIN _comm_pg_config pc ON pc.rank = r.rank AND pc.pg_name = r.pg_name
  LEFT JOIN _comm_group_texts tx ON tx.pg_ranks_text = r.pg_ranks_text
),
-- the group's size, and a p2p peer's global rank (the peer is group-local)
sized AS (
  SELECT t.*, gr.n_ranks AS group_n_ranks, pm.member AS peer_global
  FROM typed t LEFT JOIN _comm_groups gr ON gr.pg_id = t.group_id
  LEFT JOIN _comm_group_members pm ON pm.pg_id = t.group_id AND pm.idx = t.p2p_peer
)
SELECT t.* EXCLUDE (group_name, group_desc, group_id, group_n_ranks, peer_global, pg_name, pg_desc, pg_ranks_text,
                    p2p_pg_id, group_size),
       t.group_name AS pg_name, t.group_desc AS pg_desc, t.group_id AS pg_id,
       coalesce(t.group_size, t.group_n_ranks) AS group_size,
       _comm_moved_nelems(t.op, t.in_nelems, t.out_nelems) * t.elem_bytes AS bytes,
       -- the collective the backend ran on the wire and its bytes (same convention); the call's where nothing
       -- says otherwise. gloo's all_gather annotation holds a rank's input, the output is group_size of them.
       coalesce(t.run_op, t.op) AS wire_op,
       CASE WHEN t.run_op IS NULL OR t.run_nelems IS NULL OR t.run_op = t.op
              THEN _comm_moved_nelems(t.op, t.in_nelems, t.out_nelems)
            WHEN t.run_op = 'all_gather' THEN t.run_nelems * coalesce(t.group_size, t.group_n_ranks)
            ELSE t.run_nelems END * t.elem_bytes AS wire_bytes,
       row_number() OVER (PARTITION BY t.rank, coalesce(t.group_name, '') ORDER BY coalesce(t.cpu_start_ns, t.kernel_start_ns),
                          coalesce(t.cpu_event_id, t.kernel_event_id)) AS ordinal,
       -- a send and its recv: the n-th send from src to dst with a tag meets the n-th recv at dst from src with
       -- that tag (a rank's sends and recvs interleave differently on its two ends: a pipeline stage sends
       -- activations forward while its neighbour sends gradients back, so the group's ordinal does not pair them)
       CASE WHEN t.p2p_peer IS NOT NULL AND t.op IN ('send', 'recv') THEN
         CASE WHEN t.op = 'send' THEN t.rank ELSE coalesce(t.peer_global, t.p2p_peer) END END AS p2p_src,
       CASE WHEN t.p2p_peer IS NOT NULL AND t.op IN ('send', 'recv') THEN
         CASE WHEN t.op = 'recv' THEN t.rank ELSE coalesce(t.peer_global, t.p2p_peer) END END AS p2p_dst,
       CASE WHEN t.p2p_peer IS NOT NULL AND t.op IN ('send', 'recv') THEN
         row_number() OVER (PARTITION BY t.rank, coalesce(t.group_name, ''), t.op, t.p2p_peer, t.p2p_tag
                            ORDER BY coalesce(t.cpu_start_ns, t.kernel_start_ns), coalesce(t.cpu_event_id, t.kernel_event_id))
       END AS p2p_ordinal
FROM sized t;

-- _comm_inspector_rows: NCCL Inspector records as collectives rows. The key is (comm hash, coll_sn), which
-- every rank of the communicator shares. The plugin logs a per-rank message size: AllGather / ReduceScatter
-- move n_ranks times that (its own bandwidth code says so). Times exist only in verbose dumps (epoch us, the
-- host clock, not a trace's); otherwise the duration alone is known, which still gives transfer and waits.
CREATE OR REPLACE TEMP VIEW _comm_inspector_rows AS
SELECT rank, NULL::BIGINT AS step, 'nccl_inspector' AS source, op, coll AS coll_name, NULL AS dtype,
       CASE WHEN op IN ('all_gather', 'reduce_scatter') THEN msg_size_bytes * n_ranks ELSE msg_size_bytes END AS bytes,
       'inspector' AS size_source, n_ranks AS group_size, comm_hash AS pg_name, NULL AS pg_desc,
       NULL::BIGINT AS pg_id, NULL::BIGINT[] AS pg_ranks, 'inspector' AS pg_source, 'inspector' AS timeline, coll_sn AS ordinal,
       0::BIGINT AS clock_offset_ns,
       kernel_start_us * 1000 AS start_ns,
       kernel_start_us * 1000 + round(exec_time_us * 1000)::BIGINT AS end_ns,
       round(exec_time_us * 1000)::BIGINT AS dur_ns,
       'inspector' AS match_by, 'nccl:' || comm_hash || ':sn:' || coll_sn AS match_key
FROM nccl_inspector;

-- _comm_rows: _comm_rows_raw with the clock correction applied, the cross-rank match key and the group's members
-- (pg_ranks: a query that reads it gets group size x rows integers), plus the Inspector's rows (source says which).
-- start_ns is the arrival: the kernel start on a GPU, the call on a CPU (gloo) rank; end_ns is when the
-- collective finished there: the kernel end, or the end of the runloop's work (of a send's or recv's own
-- annotation when it outlasts the call: the message had gone or come; else of the call).
-- work_start_ns is when the rank began working on it: the kernel start, or when a gloo worker thread took it
-- from the queue (the runloop's work; else the call); queued_ns = work_start_ns - start_ns on a gloo rank:
-- the time it waited for a free worker behind earlier collectives (NULL on a GPU rank).
CREATE OR REPLACE TEMP VIEW _comm_trace_rows AS
SELECT r.*, gr.pg_ranks,
       coalesce(o.clock_offset_ns, 0) + coalesce(k.clock_offset_ns, 0) AS clock_offset_ns,
       CASE r.timeline WHEN 'gpu' THEN r.kernel_start_ns WHEN 'cpu' THEN r.cpu_start_ns END
         + coalesce(o.clock_offset_ns, 0) + coalesce(k.clock_offset_ns, 0) AS start_ns,
       CASE r.timeline WHEN 'gpu' THEN r.kernel_start_ns WHEN 'cpu' THEN coalesce(r.runloop_start_ns, r.cpu_start_ns) END
         + coalesce(o.clock_offset_ns, 0) + coalesce(k.clock_offset_ns, 0) AS work_start_ns,
       CASE WHEN r.timeline = 'cpu' THEN greatest(r.runloop_start_ns - r.cpu_start_ns, 0) END AS queued_ns,
       CASE r.timeline WHEN 'gpu' THEN r.kernel_end_ns WHEN 'cpu' THEN greatest(r.runloop_end_ns, r.cpu_end_ns, r.nested_end_ns) END
         + coalesce(o.clock_offset_ns, 0) + coalesce(k.clock_offset_ns, 0) AS end_ns,
       CASE WHEN r.comms_id IS NOT NULL THEN 'comms_id' WHEN r.seq IS NOT NULL THEN 'seq'
            WHEN r.p2p_ordinal IS NOT NULL THEN 'p2p' ELSE 'ordinal' END AS match_by,
       CASE WHEN r.comms_id IS NOT NULL THEN 'id:' || r.comms_id
            WHEN r.seq IS NOT NULL THEN 'pg:' || coalesce(r.pg_name, 'world') || ':seq:' || r.seq
            WHEN r.p2p_ordinal IS NOT NULL THEN 'p2p:' || coalesce(r.pg_name, 'world') || ':' || r.p2p_src || '>'
                 || r.p2p_dst || ':tag:' || coalesce(r.p2p_tag, 0) || ':n:' || r.p2p_ordinal
            ELSE 'pg:' || coalesce(r.pg_name, 'world') || ':n:' || r.ordinal END AS match_key
FROM _comm_rows_raw r
LEFT JOIN _comm_clock_offsets o ON o.rank = r.rank
LEFT JOIN ranks k ON k.rank = r.rank
LEFT JOIN _comm_groups gr ON gr.pg_id = r.pg_id;

CREATE OR REPLACE TEMP VIEW _comm_rows AS
SELECT *, 'kineto' AS source, end_ns - start_ns AS dur_ns, end_ns - work_start_ns AS work_ns FROM _comm_trace_rows
UNION ALL BY NAME
SELECT * FROM _comm_inspector_rows;

-- _comm_matched: one row per collective instance (match_key) across the ranks that recorded it. Its group is the
-- largest any of its rows names (pg_id, then pg_ranks). n_timed: participants with a start (len(timed_ranks)).
CREATE OR REPLACE TEMP VIEW _comm_matched AS
WITH g AS MATERIALIZED (
  SELECT r.match_key, any_value(r.match_by) AS match_by, any_value(r.source) AS source, mode(r.op ORDER BY r.op) AS op,
         count(DISTINCT r.op) AS op_variants,
         mode(r.pg_name ORDER BY r.pg_name) AS pg_name, mode(r.pg_desc ORDER BY r.pg_desc) AS pg_desc,
         arg_max(r.pg_id, CASE WHEN gn.n_ranks IS NOT NULL THEN [gn.n_ranks, -r.pg_id] END) AS pg_id,
         max(r.group_size) AS group_size, mode(r.dtype ORDER BY r.dtype) AS dtype, max(r.bytes) AS bytes,
         count(DISTINCT r.bytes) AS bytes_variants,
         min(r.step) AS step, mode(r.timeline ORDER BY r.timeline) AS timeline,
         list(r.rank ORDER BY r.rank) AS participants,
         list(r.rank ORDER BY r.rank) FILTER (WHERE r.start_ns IS NOT NULL) AS timed_ranks,
         count(r.start_ns) AS n_timed,
         min(r.start_ns) AS first_arrival_ns, max(r.start_ns) AS last_arrival_ns,
         -- ties (equal starts) go to the lowest rank, as TraceLens counts them, whatever order the rows come in
         arg_min(r.rank, [r.start_ns, r.rank]) AS first_arrival_rank, arg_max(r.rank, [r.start_ns, -r.rank]) AS last_arrival_rank,
         min(r.end_ns) AS first_end_ns, max(r.end_ns) AS last_end_ns,
         max(coalesce(r.work_start_ns, r.start_ns)) AS last_work_start_ns, min(coalesce(r.work_ns, r.dur_ns)) AS min_work_ns,
         min(r.dur_ns) AS min_dur_ns, round_even(median(r.dur_ns), 0)::BIGINT AS median_dur_ns
  FROM _comm_rows r LEFT JOIN _comm_groups gn ON gn.pg_id = r.pg_id GROUP BY r.match_key
),
-- the group's members without a trace in this set, and those with a trace but no row of this instance (in the
-- group's order), by joins: a membership test per member of a list is group size^2 a collective
absent AS (
  SELECT m.match_key,
         list(m.member ORDER BY m.idx) FILTER (WHERE k.rank IS NULL) AS ranks_not_traced,
         list(m.member ORDER BY m.idx) FILTER (WHERE k.rank IS NOT NULL AND p.rank IS NULL) AS ranks_missing
  FROM (SELECT g.match_key, gm.idx, gm.member FROM g JOIN _comm_group_members gm ON gm.pg_id = g.pg_id) m
  LEFT JOIN ranks k ON k.rank = m.member
  LEFT JOIN (SELECT DISTINCT match_key, unnest(participants) AS rank FROM g) p
    ON p.match_key = m.match_key AND p.rank = m.member
  GROUP BY m.match_key
)
SELECT g.*, gr.pg_ranks,
       len(g.participants) AS n_participants,
       CASE WHEN gr.pg_ranks IS NOT NULL THEN coalesce(a.ranks_not_traced, []::BIGINT[]) END AS ranks_not_traced,
       CASE WHEN gr.pg_ranks IS NOT NULL THEN coalesce(a.ranks_missing, []::BIGINT[]) END AS ranks_missing,
       g.last_arrival_ns - g.first_arrival_ns AS arrival_skew_ns,
       -- the data can only move once the last rank is working on it (its kernel runs, a gloo worker took it):
       -- when every participant is still running then, the transfer is that moment -> first finish; otherwise
       -- (no overlap, e.g. a tree broadcast that let a rank go early, or unaligned clocks) the shortest
       -- participant's time at work, as TraceLens reports. A gloo collective queued behind others on the
       -- worker threads counts its queueing in the participants' queued_ns, not in the transfer.
       CASE WHEN g.n_timed >= 2 AND g.last_work_start_ns < g.first_end_ns THEN g.first_end_ns - g.last_work_start_ns
            ELSE g.min_work_ns END AS transfer_ns,
       CASE g.op WHEN 'all_reduce' THEN 2.0 * (g.group_size - 1) / g.group_size
                 WHEN 'reduce_scatter' THEN (g.group_size - 1) / g.group_size::DOUBLE
                 WHEN 'all_gather' THEN (g.group_size - 1) / g.group_size::DOUBLE
                 WHEN 'all_to_all' THEN (g.group_size - 1) / g.group_size::DOUBLE
                 ELSE 1.0 END AS busbw_factor
FROM g LEFT JOIN absent a USING (match_key) LEFT JOIN _comm_groups gr ON gr.pg_id = g.pg_id;
