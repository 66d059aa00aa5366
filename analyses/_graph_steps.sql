-- Private (depgraph): the measured steps of the graph's ranks.
SELECT rank, step, pid, tid, ts_ns, end_ns, is_last FROM steps WHERE rank IN (SELECT unnest($ranks::BIGINT[]))
ORDER BY rank, step
