"""The Lua scripts of a durable run's lifecycle: every transition is one atomic call.

    begin.py    RUN_BEGIN: an `advance` task starts (lease, delivery count, the run loaded)
    commit.py   RUN_COMMIT: a step's value, its events and what follows, in one write (its `go_on`
                records the successor's delivery in kombu's `unacked`: workers/worker/kombu_redis.py)
    lease.py    LEASE_KEEP: a step's lease renewed, or taken again after a pause when nobody began
                the step since (workers/process/leases.py)
    deltas.py   DELTA_FLUSH: a live model step's text deltas into the event stream (workers/process/deltas.py)
    control.py  ANSWER_SEND, RUN_ANSWER, RUN_RETRY, INDEX_DROP (clients, control tasks, the sweeper)
    children.py SPAWN, CANCEL_TREE, TREE, ASKING, and RUN_COMMIT's `child_ended`: child runs (a tree's
                runs share the root's slot: workers/step/children.py, workers/runs/children.py)
    prelude.py  the Lua helpers the run scripts share (`emit`, `terminal`)

Each module documents its script's KEYS and ARGV at the top of the script and parses its reply
once, into a typed value, next to it; nothing else reads a reply by position.

Invariants the scripts keep (keys in workers/protocol/keys.py; every key of a call shares the run's
hash tag, the root's for a tree of runs):
- A journal field is written with HSETNX only, and every script that writes one returns the STORED
  value, so a caller always continues with what Redis holds (redis-py 8 retries commands itself: a
  retried write must read back, never trust "I won").
- A lease is "<owner>:<token>", the token drawn from the run's INCR fence. A commit is refused when
  the fence has moved past its token (a newer copy took the lease), so a paused copy never writes.
- Run commits are idempotent: a retry of a commit that already landed (state `n` >= its `n`) writes
  nothing again; loop events are appended only beyond the segment's committed count, so each event
  is in the stream once and in order although a replay emits them again in memory.
"""
