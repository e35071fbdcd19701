"""`Client`: what a web backend imports to start, watch, answer, cancel and retry durable runs.

    client = Client()                      # REDIS_URL and TOOLLOOP_TOOLSETS, as the workers have them
    run_id = client.enqueue({"model": "claude-sonnet-5-5", "system": "...", "toolset": "review",
                             "messages": [{"role": "user", "content": "Review the storyboard."}]},
                            idempotency_key="order-1234")  # a retry with this key makes no second run
    for event in client.events(run_id, follow=True):
        print(event.seq, event.kind)
    client.wait(run_id, timeout=60)

Every method takes a run id; an unknown one raises `RunNotFoundError`. The client knows the
registered toolsets by name only (TOOLLOOP_TOOLSETS, or `toolsets=`): it never imports one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

import redis as redis_lib

from toolloop.contract import CHAT_MESSAGES, ChatMessage
from toolloop.journal import keys, scripts
from toolloop.loop.approvals import DeadlineError
from toolloop.loop.types import Decision
from workers import accounts, approvals, limits, runlist, runs, toolsets
from workers.app import ANSWER, CANCEL, make_app, send
from workers.errors import EnqueueError, NoRedisError, RunNotFoundError, RunStateError
from workers.records import FINAL, STREAM_KINDS, RunEventRecord, RunStatus
from workers.settings import Settings, no_redis_message
from workers.spec import RunSpec

_TERMINAL_EVENTS = frozenset({"finished", "failed"})


class Client:
    def __init__(self, redis_url: str | None = None, *, toolsets: Iterable[str] | None = None) -> None:
        """`redis_url`: when None, REDIS_URL, else the embedded server of $TOOLLOOP_HOME or ./.toolloop
        when it runs (the rule of the CLI and the workers, `workers.settings.find_redis_url`), else
        `NoRedisError`. `toolsets`: the names of the registered toolsets, read
        from TOOLLOOP_TOOLSETS (names only) when None."""
        settings = Settings.from_env()
        if redis_url:
            settings = dataclasses.replace(settings, redis_url=redis_url, redis_source="redis_url=")
        elif not settings.redis_source:
            raise NoRedisError(no_redis_message())
        self.settings = settings
        self.toolsets = sorted(settings.toolsets if toolsets is None else toolsets)
        self.redis = redis_lib.Redis.from_url(settings.redis_url, decode_responses=True)
        self._blocking = redis_lib.Redis.from_url(
            settings.redis_url, decode_responses=True, socket_timeout=None
        )
        self.celery = make_app(settings)

    def close(self) -> None:
        """Release the Redis connections and the broker connection pool."""
        self.redis.close()
        self._blocking.close()
        self.celery.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start ------------------------------------------------------------------------------------

    def enqueue(self, spec: RunSpec | dict[str, Any], *, idempotency_key: str | None = None) -> str:
        """Validate `spec` (pydantic.ValidationError when bad; ToolsetError for a toolset that is not
        registered, nothing imported; LimitError over a limit), store the run and send its first
        step. Returns the run id. With `idempotency_key`, enqueueing again with the same key returns
        the same run id and makes no second run (the first spec wins). Redis refusing or losing the
        write is an `EnqueueError` that says what to do; nothing half-written stays behind."""
        checked = spec if isinstance(spec, RunSpec) else RunSpec.model_validate(spec)
        toolsets.check_name(checked.toolset, self.toolsets)
        limits.check_spec(checked, self.settings)
        if idempotency_key is not None and not (0 < len(idempotency_key) <= 256):
            raise ValueError(
                f"The idempotency key is {len(idempotency_key)} characters long.\n"
                "  Use 1 to 256 characters (an order id, a request id)."
            )
        try:
            return runs.create(self.redis, self.celery, checked, idempotency_key)
        except redis_lib.OutOfMemoryError:
            raise EnqueueError(
                "Redis is out of memory (maxmemory reached) and refused the run; nothing was stored.\n"
                "  Free memory in Redis (delete finished runs, raise maxmemory), then enqueue again"
                + (" with the same idempotency key." if idempotency_key else "."),
                stored=False,
            ) from None
        except (OSError, redis_lib.ConnectionError, redis_lib.TimeoutError) as error:
            raise EnqueueError(
                f"Lost the connection to Redis while enqueueing ({type(error).__name__}); the run may or "
                "may not be stored.\n"
                + (
                    "  Enqueue again with the same idempotency key once Redis answers: it makes one run."
                    if idempotency_key
                    else "  Check Redis, then enqueue again; pass idempotency_key= so a retry cannot make a "
                    "second run."
                ),
                stored=None,
            ) from None
        except redis_lib.RedisError as error:
            raise EnqueueError(
                f"Redis refused the run ({type(error).__name__}); nothing was stored.\n"
                "  Check the server (`toolloop doctor`), then enqueue again.",
                stored=False,
            ) from None

    # -- read -------------------------------------------------------------------------------------

    def status(self, run_id: str) -> RunStatus:
        state: dict[str, str] = self.redis.hgetall(keys.state(run_id))  # type: ignore[assignment]
        return _status(run_id, state)

    def _snapshot(self, run_id: str) -> tuple[RunStatus, int]:
        """The status and the count of answers not applied yet, read at one instant (MULTI)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(keys.state(run_id))
        pipe.hlen(keys.inbox(run_id))
        state, unapplied = pipe.execute()
        return _status(run_id, state), int(unapplied)

    def history(self, run_id: str) -> list[ChatMessage]:
        """The run's conversation: its last segment's messages (the input while nothing ran yet)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(keys.history(run_id))
        pipe.hget(keys.inputs(run_id), "s0")
        stored, first = pipe.execute()
        if stored is None and first is None:
            raise RunNotFoundError(run_id)
        return CHAT_MESSAGES.validate_json(stored or first)

    def events(
        self,
        run_id: str,
        after: str | None = None,
        block_ms: int | None = None,
        follow: bool = False,
        *,
        deltas: bool = True,
    ) -> Iterator[RunEventRecord]:
        """The run's events after stream id `after` (from the start when None), each with its stream
        `id`: pass the last one as `after` to read on from there. `block_ms` waits that long for new
        ones when there are none; `follow` keeps reading until the run's terminal event (`finished`,
        or `failed`) has been yielded. A streaming run (RunSpec.stream) has `delta` and `discarded`
        entries among them (seq None; docs/streaming.md); `deltas=False` skips those."""
        if not self.redis.exists(keys.state(run_id)):
            raise RunNotFoundError(run_id)
        cursor = after or "0-0"
        stream = keys.events(run_id)
        while True:
            wait = block_ms if block_ms is not None else (1000 if follow else None)
            reply: Any = self._blocking.xread({stream: cursor}, count=500, block=wait)
            entries: list[tuple[str, dict[str, str]]] = reply[0][1] if reply else []
            for entry_id, fields in entries:
                cursor = entry_id
                if not deltas and fields.get("kind") in STREAM_KINDS:
                    continue
                record = _record(entry_id, fields)
                yield record
                if follow and record.kind in _TERMINAL_EVENTS and self._ended(run_id):
                    return  # (a `failed` that a retry has since moved past does not end it)
            if not follow and (not entries or block_ms is not None):
                return

    def _ended(self, run_id: str) -> bool:
        return self.redis.hget(keys.state(run_id), "status") in FINAL

    def wait(self, run_id: str, timeout: float = 60.0, *, poll_s: float = 0.05) -> RunStatus:
        """The status once the run has ended, or parked on a question that no sent answer or cancel is
        on its way to; TimeoutError after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            status, unapplied = self._snapshot(run_id)
            if status.status in FINAL:
                return status
            if status.status == "asked" and not (status.cancel_requested or unapplied):
                return status
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"Run {run_id!r} is still {status.status!r} after {timeout:.0f} s.\n"
                    "  Check that a worker consumes the llm, tools and control queues, or wait longer."
                )
            time.sleep(poll_s)

    # -- act --------------------------------------------------------------------------------------

    def answer(self, run_id: str, content: str, *, segment: int | None = None) -> str:
        """Answer the run's question (the one it holds, or the next one it asks when it has not parked
        yet). The first answer to a question wins; later ones are ignored. Pass the `segment` of the
        status that showed the question to make a late duplicate (sent after the run resumed) count
        as a duplicate rather than as an early answer to the next question. Returns the answer id."""
        status, current, deadline, expired = self.redis.hmget(
            keys.state(run_id), "status", "segment", "ask_deadline", "expired_segment"
        )
        if status is None:
            raise RunNotFoundError(run_id)
        if status in FINAL and status != "expired":  # an expired question: DeadlineError below
            raise RunStateError(
                f"Run {run_id!r} has ended ({status}); it takes no answer.\n"
                "  Enqueue a new run, or retry it if it failed."
            )
        if content.startswith(approvals.DECISIONS_MARK):
            raise ValueError("An answer may not start with the record separator \\x1e.\n  Strip it.")
        target = int(current or 0) if segment is None else segment
        late = status == "expired" or (
            segment is not None and expired is not None and int(expired) == segment
        )
        if late or (status == "asked" and deadline and time.time() >= float(deadline)):
            raise DeadlineError(
                f"The question of run {run_id!r} passed its deadline before this answer; the run went on "
                f"with its default ({'stopped, expired' if status == 'expired' else 'ask_default'}).\n"
                "  Nothing was sent. Give runs a longer ask_timeout_s if answers come later."
            )
        answer_id = runs.store_answer(self.redis, run_id, target, content)
        send(
            self.celery, ANSWER, [run_id, answer_id], queue="control", task_id=f"{run_id}:answer:{answer_id}"
        )
        return answer_id

    def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Approve the held call `call_id`: the tool runs with its input. See `decide`."""
        return self.decide(
            run_id, call_id, Decision(action="approve", input_digest=digest, actor=actor), wait_s
        )

    def reject(
        self,
        run_id: str,
        call_id: str,
        reason: str,
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Reject the held call: the model reads `Rejected by the person: <reason>.`. See `decide`."""
        decision = Decision(action="reject", reason=reason, input_digest=digest, actor=actor)
        return self.decide(run_id, call_id, decision, wait_s)

    def edit(
        self,
        run_id: str,
        call_id: str,
        input: dict[str, Any],
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Run the held call with `input` instead (checked against the tool's schema by a worker; a
        bad edit raises ApprovalError with the validation message and the call still waits)."""
        decision = Decision(action="edit", input=input, input_digest=digest, actor=actor)
        return self.decide(run_id, call_id, decision, wait_s)

    def decide(self, run_id: str, call_id: str, decision: Decision, wait_s: float = 10.0) -> str:
        """Send a decision on a held call over the control queue and wait up to `wait_s` for a
        worker to apply it. Returns "resumed" (every held call decided: the run goes on), "recorded"
        (other calls still wait), "kept" (the run has not parked yet: the decision waits for it) or
        "ignored" (the call was decided already: the first decision wins). `digest` binds the decision
        to the input you saw (`status().approvals[i]["input_digest"]`). Raises ApprovalError when
        refused (another input, a bad edit, a call the run does not hold, past its deadline, an ended
        run), RunNotFoundError, or TimeoutError when no worker answered in time."""
        if not self.redis.exists(keys.state(run_id)):
            raise RunNotFoundError(run_id)
        return approvals.send_decision(
            self.redis, self._blocking, self.celery, run_id, call_id, decision, wait_s
        )

    def cancel(self, run_id: str) -> None:
        """Stop the run: its live step is aborted where it runs, open calls are answered
        `Not run: cancel.`, and it ends with status "cancel". Survives worker restarts. A run that has
        ended already raises `RunStateError`."""
        status = runs.script(self.redis, scripts.RUN_CANCEL)(
            keys=[keys.state(run_id)], args=[keys.CANCEL_CHANNEL, run_id]
        )
        if status is None:
            raise RunNotFoundError(run_id)
        if status in FINAL:
            raise RunStateError(
                f"Run {run_id!r} has ended ({status}); there is nothing to cancel.\n"
                "  `toolloop status` shows how it ended."
            )
        if status not in FINAL:
            send(self.celery, CANCEL, [run_id], queue="control", task_id=f"{run_id}:cancel")

    def retry(self, run_id: str) -> None:
        """Run a failed run again from its journal: finished steps replay, the failed one runs again."""
        stored = json.loads(self.redis.get(keys.spec(run_id)) or "{}")
        queued = {name: stored.get(name) for name in ("model", "toolset", "budget_usd")} | {"retry": True}
        result = runs.script(self.redis, scripts.RUN_RETRY)(
            keys=[keys.state(run_id), keys.attempts(run_id), keys.events(run_id), keys.outbox(run_id)],
            args=[time.time(), json.dumps(queued)],
        )
        if result[0] != "queued":
            if result[1] == "missing":
                raise RunNotFoundError(run_id)
            raise RunStateError(
                f"Run {run_id!r} is {result[1]!r}; only a failed run can be retried.\n"
                "  Wait for it to end, or enqueue a new run."
            )
        self.redis.zadd(keys.LIVE_RUNS, {run_id: time.time()})
        runlist.persist(self.redis, run_id)  # runs again: its retention starts when it ends again
        runs.send_member(self.redis, self.celery, run_id, str(result[1]))

    def list_runs(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> runlist.RunPage:
        """Runs newest first, `limit` per page; `status` keeps one status ("asked", "failed", ...);
        pass the page's `next` as `cursor` for the following page (None on the last). Finished runs
        leave the listing when their retention ends (TOOLLOOP_RETENTION)."""
        return runlist.list_runs(self.redis, status=status, limit=limit, cursor=cursor)

    def prune(self, older_than: float | None = None) -> runlist.Pruned:
        """Delete the finished runs that ended more than `older_than` s ago (default: the retention)
        and drop expired runs from the index. Parked and running runs are never touched."""
        age = self.settings.retention if older_than is None else older_than
        return runlist.prune(self.redis, age)

    def add_spend(self, run_id: str, usd: float) -> float:
        """Bill `usd` of outside spend (child work, services) to the run's budget; the new total."""
        if not self.redis.exists(keys.state(run_id)):
            raise RunNotFoundError(run_id)
        return float(self.redis.incrbyfloat(keys.spend(run_id), usd))

    def set_account_limit(
        self, account: str, usd: float, *, period: str = "day", finish_at: float = 0.9
    ) -> None:
        """Limit what the runs naming `account` (RunSpec.account) spend together: `usd` per `period`
        ("day", "month" or "total", UTC). At `finish_at` of it their model calls carry the run's
        finish_note; past it their steps stop the run `budget` (docs/flow-control.md)."""
        accounts.set_limit(self.redis, account, usd, period, finish_at)

    def accounts(self) -> list[accounts.AccountSpend]:
        """Every account with a limit: spend in its current period, and what is reserved now."""
        return accounts.spend(self.redis, time.time())


def _status(run_id: str, state: dict[str, str]) -> RunStatus:
    if not state:
        raise RunNotFoundError(run_id)
    asked = state.get("asked")
    return RunStatus(
        run_id=run_id,
        status=state["status"],
        segment=int(state.get("segment", 0)),
        steps=int(state.get("steps", 0)),
        spent_usd=float(state.get("spent_usd", 0)),
        final_text=state.get("final_text") or None,
        asked=json.loads(asked) if asked and state["status"] == "asked" else None,
        approvals=json.loads(state["approvals"])
        if state.get("approvals") and state["status"] == "asked"
        else None,
        ask_deadline=float(state["ask_deadline"]) if state.get("ask_deadline") else None,
        error_class=state.get("error_class") or None,
        error_message=state.get("error_message") or None,
        refusal=json.loads(state["refusal"])
        if state.get("refusal") and state["status"] == "refused"
        else None,
        cancel_requested=state.get("cancel") == "1",
        created_at=float(state["created"]) if "created" in state else None,
        updated_at=float(state["touched"]) if "touched" in state else None,
    )


def _record(entry_id: str, fields: dict[str, str]) -> RunEventRecord:
    if "seq" not in fields:  # a delta or a discarded marker (workers/deltas.py)
        return RunEventRecord(
            id=entry_id, seq=None, segment=int(fields["segment"]), kind=fields["kind"],
            step=int(fields["step"]), attempt=fields["attempt"], **_stream_fields(fields),
        )  # fmt: skip
    data = json.loads(fields.get("data") or "{}")
    data.pop("kind", None)
    for reserved in ("id", "seq", "segment"):
        if reserved in data:
            data[f"{reserved}_"] = data.pop(reserved)
    return RunEventRecord(
        id=entry_id, seq=int(fields["seq"]), segment=int(fields["segment"]), kind=fields["kind"], **data
    )


def _stream_fields(fields: dict[str, str]) -> dict[str, Any]:
    """A delta's `text`, and `thinking` True when it is reasoning text."""
    found: dict[str, Any] = {"text": fields["text"]} if "text" in fields else {}
    if fields.get("thinking") == "1":
        found["thinking"] = True
    return found
