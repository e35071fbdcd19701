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
local function terminal(status)
  return status == 'done' or status == 'budget' or status == 'steps' or status == 'cancel'
    or status == 'refused' or status == 'failed' or status == 'expired'
end
"""


def with_prelude(source: str) -> str:
    """`source` with PRELUDE put in after its leading comment lines (its KEYS and ARGV stay on top)."""
    lines = source.lstrip("\n").splitlines(keepends=True)
    head = 0
    while head < len(lines) and lines[head].startswith("--"):
        head += 1
    return "".join(lines[:head]) + PRELUDE + "".join(lines[head:])
