-- Kernel classification: the class every distinct GPU op name gets, and the rule that gave it.
--
-- Rules are ordered (class, pattern) regexes, user rules first, then analyses/kernel_classes.py
-- DEFAULT_RULES; the first match wins, no match means compute, memcpy/memset ops are always memory.
--
-- @column rank          global rank
-- @column kind          kernel | memcpy | memset
-- @column name          GPU op name
-- @column kernel_class  communication | memory | compute | other
-- @column rule_pattern  the regex that matched (NULL: no rule matched, or a memcpy/memset)
-- @column kernel_count  ops with this name
-- @column total_ns      sum of their durations, ns
SELECT g.rank, g.kind, g.name, g.kernel_class,
       CASE WHEN g.kind = 'kernel' THEN any_value(r.pattern) END AS rule_pattern,
       count(*) AS kernel_count, sum(g.dur_ns)::BIGINT AS total_ns
FROM _gpu_ops_in_scope($rank, $step, $drop_last_step) g
LEFT JOIN _kernel_class_of_name c ON c.name = g.name
LEFT JOIN _kernel_rules r ON r.priority = c.rule_index
GROUP BY g.rank, g.kind, g.name, g.kernel_class
ORDER BY g.rank, g.kernel_class, total_ns DESC, g.name
