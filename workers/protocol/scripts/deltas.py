"""DELTA_FLUSH: a batch of a live model step's text deltas into the run's event stream
(workers/process/deltas.py). Nobody waits for its reply (1 written, 0 fenced): a fenced copy's deltas are
simply not written."""

from __future__ import annotations

from workers.protocol.scripts.prelude import with_prelude

DELTA_FLUSH = with_prelude("""
-- A batch of model text deltas of a live step (workers/process/deltas.py), written only by the copy that
-- holds the run: KEYS[1]=state KEYS[2]=fence KEYS[3]=events
-- ARGV[1]=the lease's fencing token ARGV[2]=attempt ("<token>" or "<token>.<k>": the k-th answer
-- the provider began again within the step) ARGV[3]=segment ARGV[4]=step ARGV[5]=text ('': only
-- the marker of an earlier attempt) ARGV[6]=thinking ('1' or '') -> 1 written, 0 fenced.
-- Another attempt's deltas (a crash, a lost lease, a retried answer) get their `discarded` marker
-- first; state `streaming` names this attempt until a commit clears it (RUN_COMMIT).
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 0 end
local mark = ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[2]
if redis.call('HGET', KEYS[1], 'streaming') ~= mark then
  discard_stream(KEYS[1], KEYS[3], mark)
  if ARGV[5] == '' then return 1 end
  redis.call('HSET', KEYS[1], 'streaming', mark)
end
if ARGV[6] == '1' then
  redis.call('XADD', KEYS[3], '*', 'kind', 'delta', 'segment', ARGV[3], 'step', ARGV[4],
    'attempt', ARGV[2], 'text', ARGV[5], 'thinking', '1')
else
  redis.call('XADD', KEYS[3], '*', 'kind', 'delta', 'segment', ARGV[3], 'step', ARGV[4],
    'attempt', ARGV[2], 'text', ARGV[5])
end
return 1
""")
