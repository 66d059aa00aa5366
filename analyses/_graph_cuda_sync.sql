-- Private (depgraph): GPU-side sync records (cuda_sync) of the graph's ranks: which stream a sync call
-- waited for, and which stream a cudaStreamWaitEvent made wait on which.
SELECT rank, correlation, name,
       TRY_CAST(json_extract_string(args_json, '$.stream') AS BIGINT) AS stream,
       TRY_CAST(json_extract_string(args_json, '$.wait_on_stream') AS BIGINT) AS wait_on_stream
FROM _events WHERE rank IN (SELECT unnest($ranks::BIGINT[])) AND cat = 'cuda_sync' AND correlation IS NOT NULL
