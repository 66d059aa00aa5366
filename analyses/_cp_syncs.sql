-- Private (critical_path): GPU-side sync records (cuda_sync) of one rank: which stream a sync call
-- waited for, and which stream a cudaStreamWaitEvent made wait on which.
SELECT correlation, name, ts_ns,
       TRY_CAST(json_extract_string(args_json, '$.stream') AS BIGINT) AS stream,
       TRY_CAST(json_extract_string(args_json, '$.wait_on_stream') AS BIGINT) AS wait_on_stream
FROM events
WHERE rank = $rank AND cat = 'cuda_sync' AND correlation IS NOT NULL
