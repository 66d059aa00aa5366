-- Private (critical_path): the time window of one step on one rank; the whole rank when step is NULL.
SELECT min(ts_ns) AS start_ns, max(end_ns) AS end_ns, any_value(tid) AS tid
FROM (SELECT ts_ns, end_ns, tid FROM steps WHERE rank = $rank AND step = $step
      UNION ALL
      SELECT min(ts_ns), max(end_ns), NULL FROM events WHERE rank = $rank AND $step IS NULL AND ph = 'X')
