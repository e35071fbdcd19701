"""The Lua helpers every run script shares, put in after the script's header comment.

KEYS[1] of a script that uses them is the run's state hash; the events stream is passed as
`events_key`.
"""

from __future__ import annotations

PRELUDE = """
local function emit(state, events_key, segment, kind, data)
  local seq = redis.call('HINCRBY', state, 'seq', 1)
  redis.call('XADD', events_key, '*', 'seq', seq, 'segment', segment, 'kind', kind, 'data', data)
end
local function discard_stream(state, events_key, backed)
  -- the deltas of the attempt that streamed last (state `streaming` = "<segment>|<step>|<attempt>")
  -- are not what the journal holds unless `backed` names that attempt: mark them discarded
  local streaming = redis.call('HGET', state, 'streaming')
  if not streaming then return end
  if streaming ~= backed then
    local segment, step, attempt = string.match(streaming, '^(%d+)|(%d+)|(.*)$')
    redis.call('XADD', events_key, '*', 'kind', 'discarded', 'segment', segment, 'step', step,
      'attempt', attempt)
  end
  redis.call('HDEL', state, 'streaming')
end
local function terminal(status)
  return status == 'done' or status == 'budget' or status == 'steps' or status == 'cancel'
    or status == 'refused' or status == 'failed' or status == 'expired' or status == 'interrupted'
end
"""


def with_prelude(source: str) -> str:
    """`source` with PRELUDE put in after its leading comment lines (its KEYS and ARGV stay on top)."""
    lines = source.lstrip("\n").splitlines(keepends=True)
    head = 0
    while head < len(lines) and lines[head].startswith("--"):
        head += 1
    return "".join(lines[:head]) + PRELUDE + "".join(lines[head:])
