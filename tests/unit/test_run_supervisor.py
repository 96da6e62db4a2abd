"""`make run`'s restart policy (services/run.py): short runs' deaths counted in a row, exponential backoff."""

from __future__ import annotations

import signal

from services.run import BACKOFF_FIRST, BACKOFF_MAX, CrashBudget, _in_a_row, describe_exit, last_words


def test_the_budget_counts_short_runs_in_a_row_and_a_long_run_starts_it_over():
    budget = CrashBudget(limit=3, window=60)
    assert budget.record(10.0, 0.0) == 1 and budget.record(20.0, 11.0) == 2 and not budget.exhausted
    # that run lasted 79 s: not counted, and the budget is whole again (counted as the first of a
    # new row, it said "1 death(s) in a row within 10s of starting" after a 25 s run and stopped the
    # stack one quick death early)
    assert budget.record(100.0, 21.0) == 0
    assert budget.record(105.0, 101.0) == 1 and budget.record(110.0, 106.0) == 2 and not budget.exhausted
    assert budget.record(115.0, 111.0) == 3 and budget.exhausted
    budget = CrashBudget(limit=3, window=60)
    for t in (0.0, 100.0, 200.0, 300.0, 400.0):  # a death after every long run, forever: never exhausted
        assert budget.record(t + 99.0, t) == 0
        assert not budget.exhausted


def test_a_restart_line_says_how_the_death_was_counted():
    budget = CrashBudget(limit=5, window=10)
    budget.record(3.0, 0.0)
    assert _in_a_row(budget) == "1 death(s) in a row within 10s of starting; the stack stops at 5"
    budget.record(40.0, 15.0)
    assert _in_a_row(budget) == "up 25s, longer than 10s: not a crash loop, the count starts over"


def test_a_slow_crash_loop_is_stopped_however_few_deaths_fit_in_a_window():
    """A worker that loads its model for ~13 s and then crashes: with the backoff, 4 deaths a minute
    at most, so counting deaths over the last 60 s never reaches 5 (such a loop ran for 11 minutes)."""
    budget = CrashBudget(limit=5, window=60)
    now, deaths = 0.0, []
    while not budget.exhausted:
        started = now + budget.backoff() if deaths else now
        now = started + 13.0
        deaths.append(budget.record(now, started))
    assert deaths == [1, 2, 3, 4, 5] and now < 120.0


def test_the_backoff_doubles_with_each_death_in_a_row_up_to_its_cap():
    budget = CrashBudget(limit=100, window=60)
    delays = []
    for t in range(8):
        budget.record(float(t) + 1.0, float(t))
        delays.append(budget.backoff())
    assert delays[:3] == [BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST]
    assert max(delays) == BACKOFF_MAX and delays == sorted(delays)
    budget.record(200.0, 100.0)  # after a run of the whole window the backoff starts over
    assert budget.backoff() == BACKOFF_FIRST


def test_an_exit_is_described_by_its_code_or_signal():
    assert describe_exit(1) == "exit code 1"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200"


GROUP = """\
  + Exception Group Traceback (most recent call last):
  |   File "/work/services/consolidator/__main__.py", line 107, in _run
  |     await worker.run(stop)
  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "/work/shared/cluster.py", line 254, in execute_command
    |     raise RuntimeError(
    |     ~~~~~~~~~~~~^^^^^^
    | RuntimeError: FT.AGGREGATE on a shard-local cluster needs its namespace (shared.cluster.route)
    +------------------------------------

"""


def test_the_restart_line_repeats_the_error_not_the_frame_of_a_traceback():
    # not "consolidator-0 died, exit code 1: +-----------" (a line of the traceback's frame)
    assert last_words(GROUP) == (
        "RuntimeError: FT.AGGREGATE on a shard-local cluster needs its namespace (shared.cluster.route)"
    )
    assert last_words("Traceback (most recent call last):\n  x = f()\n      ~^^\nValueError: bad\n") == (
        "ValueError: bad"
    )
    assert last_words("engram: REDIS_URL is not set\n\n") == "engram: REDIS_URL is not set"
    assert last_words("+-----\n   \n") == ""
    assert len(last_words("E" * 900)) == 500


def test_each_consolidator_slot_keeps_one_consumer_name_across_restarts():
    """A restarted worker must find its predecessor's unacked entries under its own name (Worker's
    own-pending pass), so `make run` names the consumer by slot, not by process."""
    import socket

    from services.run import _services

    popen = {"pass_fds": (7,)}
    first = _services({}, 2, 9191, 3, 60.0, popen)
    again = _services({}, 2, 9191, 3, 60.0, popen)
    names = [svc.env.get("ENGRAM_CONSUMER_NAME") for svc in first[:2]]
    assert names == [f"{socket.gethostname()}-consolidator-{i}" for i in range(2)]
    assert names == [svc.env.get("ENGRAM_CONSUMER_NAME") for svc in again[:2]]
    assert "ENGRAM_CONSUMER_NAME" not in first[2].env  # the query service consumes nothing
    named = _services({"ENGRAM_CONSUMER_NAME": "box7"}, 1, 0, 3, 60.0, popen)
    assert named[0].env["ENGRAM_CONSUMER_NAME"] == "box7-consolidator-0"
    assert all(svc.popen is popen for svc in first)  # every service holds the data dir's lock


class _Dead:
    """A redis-server process that has exited."""

    returncode = -6
    pid = 4242

    def poll(self) -> int:
        return self.returncode


class _CrashingRedis:
    """An embedded Redis that died and dies again while each restart waits for it to answer."""

    def __init__(self) -> None:
        self.process = _Dead()
        self.starts = 0

    def log_tail(self, lines: int = 20) -> str:
        return "ASSERTION FAILED"

    def start(self):
        from deploy.embedded_redis import EmbeddedRedisError

        self.starts += 1
        self.process = _Dead()
        raise EmbeddedRedisError("redis-server exited with -6")


def test_a_redis_that_dies_while_restarting_counts_as_a_death_not_the_end_of_the_stack():
    """A recall in flight crashed each restarted Redis before it answered: the stack must not stop
    at the first failed restart, but at ENGRAM_RESTART_LIMIT deaths in a row."""
    from services.run import RedisNode, Supervisor

    server = _CrashingRedis()
    node = RedisNode("redis", server, CrashBudget(limit=3, window=60))  # type: ignore[arg-type]
    supervisor = Supervisor([], [node])
    codes = []
    while len(codes) < 10 and 1 not in codes:
        codes.append(supervisor._check(node))
        if node.restart_at is not None:
            node.restart_at = 0.0  # its backoff waited out
    assert codes == [None] * 4 + [1] and server.starts == 2  # two more tries, then the limit stops it


def test_a_service_still_loading_is_said_again_so_a_first_start_is_never_silent(monkeypatch):
    """A first start unpacks and exports the model for tens of seconds; `make run` said "loading
    embedder" once, then nothing until ready (42 s at a first start)."""
    import time

    from services import run

    lines: list[str] = []
    answers = iter([(503, {"pending": ["embedder"]})] * 6 + [(200, {})])
    monkeypatch.setattr(run, "_probe", lambda url: next(answers))
    monkeypatch.setattr(run, "_say", lambda message, **kw: lines.append(message))
    progress = run.Progress(time.monotonic(), {"query service": "http://127.0.0.1:9/readyz"})
    progress.STILL = 0.5
    progress.run()  # in this thread: returns once every service answered 200
    assert lines[0].startswith("query service answering at ") and lines[0].endswith("loading embedder")
    assert any(line.startswith("query service still loading embedder at ") for line in lines[1:-2])
    assert lines[-2].startswith("query service ready in ") and lines[-1].startswith("stack ready in ")


def test_a_service_answers_once_and_then_says_what_it_loads_next(monkeypatch):
    """The query service loads its embedder, then its index: the second step was said as a second
    "answering at", as if the service had started again."""
    import time

    from services import run

    lines: list[str] = []
    answers = iter(
        [(503, {"pending": ["embedder", "index"]})] * 2 + [(503, {"pending": ["index"]}), (200, {})]
    )
    monkeypatch.setattr(run, "_probe", lambda url: next(answers))
    monkeypatch.setattr(run, "_say", lambda message, **kw: lines.append(message))
    run.Progress(time.monotonic(), {"query service": "http://127.0.0.1:9/readyz"}).run()
    assert len(lines) == 4, lines
    assert lines[0].startswith("query service answering at ") and lines[0].endswith("loading embedder, index")
    assert lines[1].startswith("query service loading index at "), lines
    assert lines[2].startswith("query service ready in ") and lines[3].startswith("stack ready in ")
