-- Shared private fragment: what fills the allocator, block by block and category by category, the one
-- attribution memory_breakdown (at the peak) and memory_category_timeline (over time) read. Spliced by
-- analyses/_sql.py where a .sql file says `-- @include _memory_blocks`, at the head of a WITH list; needs
-- $rank, $data_loading_pattern (analyses/host_time.py), the macros _cpu_op_is_comm (_common.sql) and _tensor_*
-- (_tensor_args.sql). Defines, among private steps:
--   _mem_peak            the peak per rank and device (_memory_peak.sql: memory_peak's rule)
--   _mem_category_bytes  per [memory] event, the bytes of each category after it (parameters_bytes,
--                        gradients_bytes, optimizer_state_bytes, activations_bytes, communication_buffers_bytes,
--                        other_bytes), which add up to the event's Total Allocated exactly
--   _mem_category_long   the same, one row per event and category (category, category_order, bytes)
--   _mem_categories      the six categories (category, category_order)
--
-- Blocks: an allocation (Bytes > 0) lives until the next event at its address on its rank and device: the free
-- that ends it or, where the free was lost, the allocation that reuses the address; on a CPU device a collective's
-- buffer whose free was lost ends after its transfer if that came first (_memory_events.sql, whose events read
-- Total Allocated less the lost frees' bytes).
-- A block's category comes from the CPU operators and annotations around its allocation on its thread, and how
-- long it lives, first rule that holds:
--   parameters             under FSDP2's all-gather (FSDP::all_gather*, fsdp::all_gather_copy_in,
--                          fsdp::split_with_sizes_copy) or its FSDP::pre_forward: the unsharded parameters and the
--                          buffer they are gathered in (a replicate()d module, or a one-rank shard group, copies them
--                          in its pre-forward without an all-gather)
--   communication_buffers  in a communication call (_cpu_op_is_comm: c10d::*, functional collectives, nccl:*,
--                          gloo:*, record_param_comms), live as long as it may (a buffer gloo's worker thread frees
--                          has no free event on a CPU trace: _memory_events.sql)
--   gradients              in the backward (autograd::engine::evaluate_function: *, *Backward<N> nodes,
--                          FSDP::post_backward*, FSDP::root_post_backward*) and either still live after the step's
--                          backward ends (FSDP2's reduce-scatter output: the sharded gradients) or freed inside
--                          AccumulateGrad, DDP's reducer or FSDP2's FSDP::post_backward_reduce (a gradient handed
--                          over to .grad, a bucket or the reduce-scatter's input: a compiled backward's outputs,
--                          DDP's per-parameter gradients, FSDP2's unsharded gradients)
--   communication_buffers  in FSDP::post_backward_reduce, freed within the backward: the gradients packed into the
--                          reduce-scatter's input
--   optimizer_state        in Optimizer.step#* and still live after it ends (a temporary freed inside it: other)
--   gradients              in DDP's reducer (torch.distributed.ddp.reducer::*, torch::distributed::reducer::*) or
--                          in torch::autograd::AccumulateGrad (what it allocates is a parameter's .grad)
--   activations            in the backward, under an operator the forward ran at its top level, nested inside a
--                          backward node: activation checkpointing's recompute (arithmetic, copies, views and
--                          factories, which backward nodes call as well, do not count as the forward's)
--   other                  anything else in the backward (gradients of activations, temporaries)
--   other                  in Optimizer.zero_grad#*, data loading ($data_loading_pattern), a loss operator
--                          (name holding 'loss': the loss and its softmax), or outside every ProfilerStep#N
--   activations            the rest of a step: the forward (what autograd saves for the backward and its
--                          temporaries)
-- Bytes allocated before profiling started have no allocation event ("Memory block of unknown size was
-- allocated before the profiling started"): at any event they are Total Allocated minus the live known
-- blocks. They are split by the model state the trace shows, on the rank's device with the largest peak (the
-- accelerator in a GPU job) and into other on its other devices:
--   P (parameter_bytes): the parameters the rank's optimizer updates (analyses/_parameter_bytes.sql)
--   parameters = min(pre-profiling bytes, P); optimizer_state = min(the rest, 2 x P) when the optimizer is Adam
--   or AdamW (Optimizer.step#Adam.step, #AdamW.step: exp_avg and exp_avg_sq, each a parameter's size); the rest:
--   other. Without shapes (record_shapes=False, or no optimizer step nor AccumulateGrad) all of it is other.
-- @include _memory_events
-- @include _memory_peak
_mem_categories AS (
  SELECT * FROM (VALUES ('parameters', 1), ('gradients', 2), ('optimizer_state', 3), ('activations', 4),
                        ('communication_buffers', 5), ('other', 6)) t(category, category_order)
),
_mem_blocks AS (
  SELECT rank, device_type, device_id, pid, tid, alloc_event_id, alloc_ts_ns, bytes, end_event_id, end_ts_ns, end_pid,
         end_tid
  FROM _mem_block_ends
),
-- the threads that run the steps (ProfilerStep#N): the callers'
_mem_step_threads AS (
  SELECT DISTINCT rank, pid, tid FROM events
  WHERE ph = 'X' AND starts_with(name, 'ProfilerStep#') AND ($rank IS NULL OR rank = $rank)
),
_mem_ops_all AS (
  SELECT e.rank, e.pid, e.tid, e.name, e.cat, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, t.tid IS NOT NULL AS on_step_thread
  FROM events e LEFT JOIN _mem_step_threads t ON t.rank = e.rank AND t.pid = e.pid AND t.tid = e.tid
  WHERE e.ph = 'X' AND e.cat IN ('cpu_op', 'user_annotation') AND e.dur_ns > 0 AND ($rank IS NULL OR e.rank = $rank)
    AND e.rank IN (SELECT DISTINCT rank FROM _mem_events)
),
_mem_step_of_op AS (
  SELECT o.*, CASE WHEN o.ts_ns < s.end_ns THEN s.step END AS step
  FROM _mem_ops_all o ASOF LEFT JOIN steps s ON o.rank = s.rank AND o.ts_ns >= s.ts_ns
),
_mem_kinds AS (
  SELECT *, CASE
      WHEN regexp_matches(name, '^(FSDP::all_gather|fsdp::all_gather_copy_in|fsdp::split_with_sizes_copy|FSDP::pre_forward$)')
        THEN 'unshard'
      WHEN starts_with(name, 'FSDP::post_backward_reduce') THEN 'reduce'
      WHEN regexp_matches(name, '^FSDP::(post_backward|root_post_backward)') THEN 'backward'
      -- the call (a c10d operator, a functional collective, record_param_comms); a gloo: / nccl: annotation on a
      -- step's thread is not: an asynchronous collective's annotation spans its flight on the caller's thread, and
      -- a pipeline stage's next forward runs inside its send's. On another thread (gloo's worker) it is the
      -- collective's own work, and what it allocates its buffers
      WHEN _cpu_op_is_comm(name) AND (cat = 'cpu_op' OR NOT on_step_thread) THEN 'comm'
      WHEN starts_with(name, 'Optimizer.step#') THEN 'optimizer'
      WHEN starts_with(name, 'Optimizer.zero_grad#') THEN 'zero_grad'
      WHEN regexp_matches(name, '^(torch\.distributed\.ddp\.reducer::|torch::distributed::reducer::)') THEN 'reducer'
      WHEN name = 'torch::autograd::AccumulateGrad' THEN 'accumulate_grad'
      WHEN starts_with(name, 'autograd::engine::evaluate_function: ') THEN 'backward'
      -- an autograd node (AddmmBackward0, a Function's <Name>Backward); not a Function the forward applies whose
      -- name holds the word (FSDP2's RegisterPostBackwardFunction, in every module's pre-forward)
      WHEN cat = 'cpu_op' AND regexp_matches(name, '^\w+Backward\d*$') THEN 'backward_node'
      WHEN regexp_matches(name, $data_loading_pattern) THEN 'data_loading'
      WHEN cat = 'cpu_op' AND contains(lower(name), 'loss') THEN 'loss'
    END AS kind
  FROM _mem_step_of_op
),
-- the step's backward: from its first backward operator to the end of its last (every thread of the rank)
_mem_backward AS (
  SELECT rank, step, min(ts_ns) AS backward_start_ns, max(end_ns) AS backward_end_ns
  FROM _mem_kinds WHERE kind IN ('backward', 'backward_node', 'accumulate_grad') AND step IS NOT NULL
  GROUP BY rank, step
),
-- operators the forward runs at its top level (inside no other operator, before the step's backward starts):
-- met again under a backward node, they are activation checkpointing's recompute
_cpu AS (SELECT * FROM _mem_step_of_op WHERE cat = 'cpu_op'),
-- @include _top_ops
_mem_forward_names AS (
  SELECT DISTINCT t.rank, t.name
  FROM _top_flag t JOIN _mem_backward b ON b.rank = t.rank AND b.step = t.step
  WHERE t.is_top AND t.ts_ns < b.backward_start_ns AND NOT contains(lower(t.name), 'backward')
    AND NOT regexp_matches(t.name, '^aten::(empty\w*|zeros\w*|ones\w*|full\w*|fill_|zero_|to|_to_copy|copy_|clone|' ||
                                   'detach|view|reshape|_unsafe_view|t|transpose|permute|expand|as_strided|contiguous|' ||
                                   'slice|select|split\w*|chunk|cat|add_?|sub_?|mul_?|div_?|sum|mm|bmm|matmul)$')
),
_mem_ops AS (
  SELECT k.rank, k.pid, k.tid, k.ts_ns, k.end_ns,
         coalesce(k.kind, 'forward_op') AS kind
  FROM _mem_kinds k LEFT JOIN _mem_forward_names f ON f.rank = k.rank AND f.name = k.name AND k.cat = 'cpu_op'
  WHERE k.kind IS NOT NULL OR f.name IS NOT NULL
),
_mem_context AS (
  SELECT b.rank, b.device_type, b.device_id, b.alloc_event_id,
         bool_or(o.kind = 'unshard') AS in_unshard,
         bool_or(o.kind = 'comm') AS in_comm,
         bool_or(o.kind = 'reduce') AS in_reduce,
         max(o.end_ns) FILTER (WHERE o.kind = 'optimizer') AS optimizer_end_ns,
         bool_or(o.kind = 'zero_grad') AS in_zero_grad,
         bool_or(o.kind IN ('reducer', 'accumulate_grad')) AS in_grad_op,
         bool_or(o.kind IN ('backward', 'backward_node', 'accumulate_grad')) AS in_backward,
         max(o.ts_ns) FILTER (WHERE o.kind = 'backward_node') AS node_ts_ns,
         max(o.ts_ns) FILTER (WHERE o.kind = 'forward_op') AS forward_op_ts_ns,
         bool_or(o.kind IN ('data_loading', 'loss')) AS in_other
  FROM _mem_blocks b
  JOIN _mem_ops o ON o.rank = b.rank AND o.pid = b.pid AND o.tid = b.tid
                 AND o.ts_ns <= b.alloc_ts_ns AND b.alloc_ts_ns <= o.end_ns
  GROUP BY b.rank, b.device_type, b.device_id, b.alloc_event_id
),
-- blocks freed by AccumulateGrad, DDP's reducer or FSDP's post-backward reduce: a gradient handed over (accumulated
-- into .grad, copied into a bucket or into the reduce-scatter's input), such as a compiled backward's outputs
_mem_handed_over AS (
  SELECT DISTINCT b.rank, b.alloc_event_id
  FROM _mem_blocks b
  JOIN _mem_ops o ON o.rank = b.rank AND o.pid = b.end_pid AND o.tid = b.end_tid
                 AND o.ts_ns <= b.end_ts_ns AND b.end_ts_ns <= o.end_ns
  WHERE o.kind IN ('accumulate_grad', 'reducer', 'reduce')
),
_mem_block_step AS (
  SELECT b.*, CASE WHEN b.alloc_ts_ns < s.end_ns THEN s.step END AS step
  FROM _mem_blocks b ASOF LEFT JOIN steps s ON b.rank = s.rank AND b.alloc_ts_ns >= s.ts_ns
),
_mem_block_category AS (
  SELECT b.rank, b.device_type, b.device_id, b.alloc_event_id, b.end_event_id, b.bytes,
    CASE
      WHEN c.in_unshard THEN 'parameters'
      WHEN c.in_comm THEN 'communication_buffers'
      WHEN c.in_backward AND (b.end_ts_ns IS NULL OR b.end_ts_ns > bw.backward_end_ns OR h.rank IS NOT NULL)
        THEN 'gradients'
      WHEN c.in_reduce THEN 'communication_buffers'
      WHEN c.optimizer_end_ns IS NOT NULL THEN
        CASE WHEN b.end_ts_ns IS NULL OR b.end_ts_ns > c.optimizer_end_ns THEN 'optimizer_state' ELSE 'other' END
      WHEN c.in_grad_op THEN 'gradients'
      WHEN c.in_backward THEN
        CASE WHEN c.forward_op_ts_ns > c.node_ts_ns THEN 'activations' ELSE 'other' END
      WHEN c.in_zero_grad OR c.in_other OR b.step IS NULL THEN 'other'
      ELSE 'activations'
    END AS category
  FROM _mem_block_step b
  LEFT JOIN _mem_context c ON c.rank = b.rank AND c.alloc_event_id = b.alloc_event_id
  LEFT JOIN _mem_backward bw ON bw.rank = b.rank AND bw.step = b.step
  LEFT JOIN _mem_handed_over h ON h.rank = b.rank AND h.alloc_event_id = b.alloc_event_id
),
-- the model state the trace shows, per rank (the header's P)
-- @include _parameter_bytes
_mem_model_state AS (
  SELECT r.rank, p.parameter_bytes, p.parameter_bytes_source,
         coalesce((SELECT bool_or(regexp_matches(s.name, '^Optimizer\.step#(Adam|AdamW)\.step$'))
                   FROM _param_optimizer_steps s WHERE s.rank = r.rank), false) AS adam
  FROM (SELECT DISTINCT rank FROM _mem_events) r
  LEFT JOIN _param_bytes p ON p.rank = r.rank
),
-- the device that holds the parameters made before profiling: the rank's largest peak
_mem_state_device AS (
  SELECT rank, arg_max(device_type, (peak_allocated_bytes, device_type)) AS device_type,
         arg_max(device_id, (peak_allocated_bytes, device_type)) AS device_id
  FROM _mem_peak GROUP BY rank
),
_mem_deltas AS (
  SELECT rank, alloc_event_id AS event_id, category, bytes AS delta_bytes FROM _mem_block_category
  UNION ALL
  SELECT rank, end_event_id, category, -bytes FROM _mem_block_category WHERE end_event_id IS NOT NULL
),
_mem_event_deltas AS (
  SELECT e.rank, e.device_type, e.device_id, e.ts_ns, e.event_id, e.total_allocated,
         coalesce(sum(d.delta_bytes) FILTER (WHERE d.category = 'parameters'), 0) AS d_parameters,
         coalesce(sum(d.delta_bytes) FILTER (WHERE d.category = 'gradients'), 0) AS d_gradients,
         coalesce(sum(d.delta_bytes) FILTER (WHERE d.category = 'optimizer_state'), 0) AS d_optimizer_state,
         coalesce(sum(d.delta_bytes) FILTER (WHERE d.category = 'activations'), 0) AS d_activations,
         coalesce(sum(d.delta_bytes) FILTER (WHERE d.category = 'communication_buffers'), 0) AS d_communication_buffers,
         coalesce(sum(d.delta_bytes) FILTER (WHERE d.category = 'other'), 0) AS d_other
  FROM _mem_events e LEFT JOIN _mem_deltas d ON d.rank = e.rank AND d.event_id = e.event_id
  GROUP BY e.rank, e.device_type, e.device_id, e.ts_ns, e.event_id, e.total_allocated
),
_mem_known AS (
  SELECT rank, device_type, device_id, ts_ns, event_id, total_allocated,
         sum(d_parameters) OVER w AS known_parameters, sum(d_gradients) OVER w AS known_gradients,
         sum(d_optimizer_state) OVER w AS known_optimizer_state, sum(d_activations) OVER w AS known_activations,
         sum(d_communication_buffers) OVER w AS known_communication_buffers, sum(d_other) OVER w AS known_other
  FROM _mem_event_deltas
  WINDOW w AS (PARTITION BY rank, device_type, device_id ORDER BY ts_ns, event_id ROWS UNBOUNDED PRECEDING)
),
_mem_pre AS (
  SELECT k.*,
         k.total_allocated - (k.known_parameters + k.known_gradients + k.known_optimizer_state + k.known_activations
                              + k.known_communication_buffers + k.known_other) AS pre_profiling_bytes,
         CASE WHEN d.rank IS NOT NULL THEN m.parameter_bytes END AS state_parameter_bytes,
         d.rank IS NOT NULL AND m.adam AS state_adam
  FROM _mem_known k
  LEFT JOIN _mem_model_state m ON m.rank = k.rank
  LEFT JOIN _mem_state_device d ON d.rank = k.rank AND d.device_type = k.device_type AND d.device_id = k.device_id
),
_mem_pre_split AS (
  SELECT *, greatest(0, least(pre_profiling_bytes, coalesce(state_parameter_bytes, 0))) AS pre_parameters,
         CASE WHEN state_adam THEN
           greatest(0, least(pre_profiling_bytes - greatest(0, least(pre_profiling_bytes, coalesce(state_parameter_bytes, 0))),
                             2 * coalesce(state_parameter_bytes, 0)))
         ELSE 0 END AS pre_optimizer_state
  FROM _mem_pre
),
_mem_category_bytes AS (
  SELECT rank, device_type, device_id, ts_ns, event_id, total_allocated,
         (known_parameters + pre_parameters)::BIGINT AS parameters_bytes,
         known_gradients::BIGINT AS gradients_bytes,
         (known_optimizer_state + pre_optimizer_state)::BIGINT AS optimizer_state_bytes,
         known_activations::BIGINT AS activations_bytes,
         known_communication_buffers::BIGINT AS communication_buffers_bytes,
         (known_other + pre_profiling_bytes - pre_parameters - pre_optimizer_state)::BIGINT AS other_bytes,
         pre_profiling_bytes::BIGINT AS pre_profiling_bytes
  FROM _mem_pre_split
),
_mem_category_long AS (
  SELECT c.rank, c.device_type, c.device_id, c.ts_ns, c.event_id, k.category, k.category_order,
         CASE k.category WHEN 'parameters' THEN c.parameters_bytes WHEN 'gradients' THEN c.gradients_bytes
                         WHEN 'optimizer_state' THEN c.optimizer_state_bytes WHEN 'activations' THEN c.activations_bytes
                         WHEN 'communication_buffers' THEN c.communication_buffers_bytes ELSE c.other_bytes
         END AS bytes
  FROM _mem_category_bytes c CROSS JOIN _mem_categories k
),
