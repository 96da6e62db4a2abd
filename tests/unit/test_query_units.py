"""Pure parts of the query service: request models, auth helpers, insights, OpenAPI paths, entry point."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_episodic.events import Action, Episode, Feedback, Task
from services.query import __main__ as entry
from services.query.auth import check_bind, is_loopback, namespace_for
from services.query.insights import (
    choose_strategy,
    current_evidence,
    prompt_section,
    skill_profiles,
    suggestion,
    text_approaches,
)
from services.query.models import RecallRequest
from services.query.openapi import openapi_path
from services.query.problems import Invalid, validate


def fields_of(exc: Invalid) -> dict[str, str]:
    return dict(exc.errors)


def test_recall_request_defaults_and_parsing():
    req = validate(
        RecallRequest,
        {
            "query": "q",
            "outcome": "success",
            "category": ["a,b", "x|y"],
            "half_life": "12h",
            "since": "2025-07-25T00:00:00-07:00",
            "until": 1.8e9,
        },
    )
    assert req.outcome == ("success",) and req.category == ("a,b", "x|y")  # C18: one value each
    assert req.half_life == 43200 and req.since == 1753426800.0 and req.until == 1.8e9
    assert (req.mode, req.normalize, req.recency_from, req.touch, req.top_k) == (
        None,
        "none",
        "completed",
        False,
        None,
    )


@pytest.mark.parametrize(
    "body,field,reason",
    [
        ({"query": " "}, "query", "must not be empty or blank"),
        ({"query": "q", "top_k": 0}, "top_k", "must be an integer between 1 and 100"),
        ({"query": "q", "top_k": 101}, "top_k", "must be an integer between 1 and 100"),
        ({"query": "q", "reward": {"between": [0, 1]}}, "reward.between", "is not a known field"),
        ({"query": "q", "since": 2, "until": 1}, "since", "must not be later than until"),
        ({"query": "q", "agent_id": ""}, "agent_id", "must not be empty or blank"),
        ({"query": "q", "agent_id": "a\x00b"}, "agent_id", "must not contain control characters"),
        ({"query": "q", "half_life": 0}, "half_life", "must be a positive number of seconds"),
        ({"query": "q", "weights": {}}, "weights", "at least one weight must be > 0"),
        ({"query": "q", "outcome": []}, "outcome", "must be a string or a non-empty list of strings"),
    ],
)
def test_recall_request_errors_name_the_field(body, field, reason):
    with pytest.raises(Invalid) as info:
        validate(RecallRequest, body)
    assert fields_of(info.value)[field] == reason


def test_namespace_for_bearer_keys():
    keys = {"k1": "ns-1", "k2": "ns-2"}
    assert namespace_for(keys, "Bearer k2") == "ns-2"
    assert namespace_for(keys, "bearer  k1 ") == "ns-1"
    assert namespace_for(keys, "BEARER\tk1\t") == "ns-1"
    for header in (None, "", "Bearer", "Bearer k3", "Basic k1", "k1", "Bearerk1", "Bearer  ", "Bearer k1 k2"):
        assert namespace_for(keys, header) is None
    # only ASCII blanks separate or pad: a key with Unicode spaces around it is another key
    for header in (
        "Bearer \u2003k1\u2003",
        "Bearer k1\u00a0",
        "Bearer\u00a0k1",
        "Bearer\u2003k1",
        "Bearer k1\udca0",
        "B\u0130arer k1",
        "Bearer \ufeffk1",
    ):
        assert namespace_for(keys, header) is None, repr(header)
    # a non-UTF-8 byte arrives as a lone surrogate; it is compared as the byte it was, nothing raises
    assert namespace_for({"k\udca0": "ns-raw"}, "Bearer k\udca0") == "ns-raw"


def test_bind_rules():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    assert not is_loopback("localhost.localdomain"), "/etc/hosts may point it anywhere"
    check_bind("127.0.0.1", {})
    check_bind("0.0.0.0", {"k": "ns"})
    with pytest.raises(ValueError, match="ENGRAM_API_KEYS"):
        check_bind("0.0.0.0", {})
    for keys in ({}, {"k": "ns"}):  # a URL's bracketed form cannot be bound: refused, not a traceback
        with pytest.raises(ValueError, match=r"without brackets \(::1\)"):
            check_bind("[::1]", keys)


def test_entry_point_refuses_without_redis_url_or_on_public_host(monkeypatch, capsys):
    monkeypatch.setattr(entry.os, "environ", {})
    assert entry.main() == 2
    assert "make run" in capsys.readouterr().err
    monkeypatch.setattr(entry.os, "environ", {"REDIS_URL": "redis://127.0.0.1:1/0", "ENGRAM_HOST": "0.0.0.0"})
    assert entry.main() == 2
    assert "not a loopback address" in capsys.readouterr().err
    monkeypatch.setattr(entry.os, "environ", {"REDIS_URL": "redis://x", "ENGRAM_HALF_LIFE": "abc"})
    assert entry.main() == 2
    assert "ENGRAM_HALF_LIFE" in capsys.readouterr().err


def test_openapi_path():
    assert openapi_path("/v1/episodes/{episode_id:.+}") == "/v1/episodes/{episode_id}"
    assert openapi_path("/v1/skills") == "/v1/skills"


def ep(i: int, outcome: str, strategy: str | None = None, **kw) -> Episode:
    return Episode(
        episode_id=f"e{i}", task=Task(description="t"), outcome=outcome, strategy_used=strategy, **kw
    )


def test_choose_strategy_rules_in_order():
    similar = [
        ep(1, "success", "example_driven"),
        ep(2, "success", "example_driven"),
        ep(3, "failure", "example_driven"),
        ep(4, "success", "iterative"),
    ]
    got = choose_strategy(similar, complexity=0.9, category_profile={"weak": True})
    assert (got["strategy"], got["rule"]) == ("example_driven", "reuse")  # 2 successes beat 1
    at_rate = [
        ep(1, "success", "x"),
        ep(2, "success", "x"),
        ep(3, "failure", "x"),
        ep(4, "failure", "x"),
        ep(5, "success", "x"),
    ]  # 3/5 = 0.6 is not above 0.6
    profile = {"weak": True, "category": "c", "success_rate": 0.2, "episodes": 5}
    assert choose_strategy(at_rate, complexity=None, category_profile=profile)["strategy"] == "defensive"
    assert choose_strategy([], complexity=0.71, category_profile=None)["strategy"] == "iterative"
    assert choose_strategy([], complexity=0.29, category_profile=None)["strategy"] == "exploratory"
    assert choose_strategy([], complexity=0.5, category_profile={"weak": False})["strategy"] == "iterative"
    assert choose_strategy([], complexity=None, category_profile=None)["strategy"] == "conservative"


def test_advice_reports_no_change_of_an_episode_without_an_approach():
    """Episodes that record neither a strategy nor a tool (the solution's words alone): their outcomes
    flip, but there is no approach to name, so nothing is cut and no `null` strategy is reported."""
    at = [ep(i, "success" if i < 8 else "failure", completed_at=1000.0 + i) for i in range(14)]
    kept, changed = current_evidence(at)
    assert changed == [] and len(kept) == 14
    assert "changed" not in choose_strategy(at, complexity=None, category_profile=None)["evidence"]
    assert suggestion(at)["changed"] == []


def solution_only(pip_failures: int) -> list[Episode]:
    """6 pip successes, then `pip_failures` pip failures alternating with 4 uv successes (text only)."""
    old = [ep(i, "success", solution="ran pip install -r requirements.txt", completed_at=i) for i in range(6)]
    broke, uv = "tried pip install but it broke: ResolutionImpossible", "ran uv sync with the lockfile"
    new = [ep(100 + j, "failure", solution=broke, completed_at=100 + 2 * j) for j in range(pip_failures)]
    new += [ep(200 + j, "success", solution=uv, completed_at=101 + 2 * j) for j in range(4)]
    return old + new


def test_the_solution_text_names_the_approach_that_changed_and_what_works_now():
    similar = solution_only(4)
    ok = [e.outcome == "success" for e in similar]
    assert text_approaches(similar, ok) == ["pip"] * 10 + ["uv"] * 4
    # one pip failure: no flip, so no text names an approach and advice is as without the texts
    assert (
        text_approaches(solution_only(1), [e.outcome == "success" for e in solution_only(1)]) == [None] * 11
    )
    # a recorded strategy is never read from the texts
    tagged = [ep(i, e.outcome, "iterative", solution=e.solution) for i, e in enumerate(similar[:6])]
    assert text_approaches(tagged + similar[6:], ok) == [None] * 14


def test_suggestion_confidence_levels():
    assert suggestion([])["confidence"] == "low"
    assert suggestion([ep(1, "success"), ep(2, "success"), ep(3, "failure")])["confidence"] == "medium"
    assert suggestion([ep(i, "success") for i in range(7)] + [ep(9, "abandoned")])["confidence"] == "high"
    got = suggestion(
        [
            ep(
                1,
                "failure",
                feedback=Feedback(message="boom"),
                outcome_details="boom",
                actions=(Action(action_type="edit", success=False, error="boom"),),
            )
        ]
    )
    assert got["common_failures"] == [{"message": "boom", "count": 1}]  # counted once per episode
    assert got["failed_action_types"] == [{"action_type": "edit", "count": 1}]


def test_a_strategy_that_stopped_working_is_not_recommended():
    """X succeeded 10 times, then failed 5 times while Y succeeded 5 times. Counting everything, X has
    the most successes (10 of 15 = 67% > 60%) and was reused; its newest regime is 0 of 5."""
    old = [ep(i, "success", "X", completed_at=1000.0 + i) for i in range(10)]
    new = [
        ep(
            20 + i,
            "failure" if i % 2 == 0 else "success",
            "X" if i % 2 == 0 else "Y",
            completed_at=2000.0 + i,
        )
        for i in range(10)
    ]
    similar = new + old  # nearest first: any order
    got = choose_strategy(similar, complexity=None, category_profile=None)
    assert (got["strategy"], got["rule"]) == ("Y", "reuse")
    assert got["evidence"]["changed"] == [
        {
            "strategy": "X",
            "since": "1970-01-01T00:33:20Z",
            "episodes": 5,
            "successes": 0,
            "earlier_episodes": 10,
            "earlier_successes": 10,
        }
    ]
    assert got["evidence"]["similar_episodes"] == 20
    tip = suggestion(similar)
    assert tip["successful_strategies"] == [{"strategy": "Y", "count": 5}]
    assert (tip["successes"], tip["failures"], tip["confidence"]) == (5, 5, "medium")
    assert tip["changed"][0]["strategy"] == "X"
    # without a flip nothing changes: the old rules on all the evidence
    steady = [ep(i, "success" if i % 3 else "failure", "X", completed_at=float(i)) for i in range(9)]
    assert suggestion(steady)["changed"] == [] and suggestion(steady)["successes"] == 6


def test_skill_profiles_mark_weak():
    rows = [{"category": "a", "episodes": 4, "successes": 1, "avg_reward": None, "avg_iterations": None}]
    assert skill_profiles(rows, 0.5)[0]["weak"] and not skill_profiles(rows, 0.25)[0]["weak"]


RESULT = {
    "episode": {
        "episode_id": "e",
        "task": {"description": "d " * 300},
        "outcome": "success",
        "solution": "s " * 500,
        "feedback": {"reward": 1.0, "message": "ok"},
    },
    "priority": 0.9,
}
REPLAY = {
    "episodes": 1,
    "avg_reward": 1.0,
    "success_rate": 1.0,
    "strategies": [{"strategy": "x", "episodes": 1, "success_rate": 1.0}],
}


@given(st.text(min_size=1, max_size=500), st.integers(min_value=1, max_value=5000), st.integers(0, 6))
def test_prompt_section_never_exceeds_budget(task, max_chars, n):
    text, truncated = prompt_section(task, "cat", [RESULT] * n, REPLAY, [{"text": "f"}], max_chars)
    assert len(text) <= max_chars
    if not truncated:
        assert text.count("### Episode") == n


def test_the_public_routes_are_the_probes_the_document_and_the_console():
    from services.query.console import assets
    from services.query.routes import ROUTES

    assert {r.path for r in ROUTES if r.public} == {
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/docs",
        "/docs/init.js",
        "/docs/swagger-ui.css",
        "/docs/swagger-ui-bundle.js",
        "/docs/favicon-32x32.png",
        "/console",
        *(f"/console/{name}" for name in assets()),
    }


def test_every_route_documents_its_success_answer():
    from services.query.app import openapi_document
    from services.query.openapi import PAGE_FILES
    from services.query.routes import ROUTES

    documented = [r for r in ROUTES if not r.path.startswith(PAGE_FILES)]
    untyped = [f"{r.method} {r.path}" for r in documented if r.answer is None and r.response is None]
    assert untyped == [], "give these routes answer=<a model of services.query.answers> (or response=)"
    for path, ops in openapi_document()["paths"].items():
        for method, op in ops.items():
            ((status, success),) = [(s, r) for s, r in op["responses"].items() if s.startswith("2")]
            for media in success["content"].values():
                assert media["schema"] != {"type": "object"}, (method, path)
                assert "$ref" in media["schema"] or media["schema"].get("type") == "string", (method, path)


def test_a_fact_answer_documents_every_field_a_fact_has():
    """`Fact.to_json` sends every field of `shared.facts.Fact` but the centroid and the deterministic text:
    a field added to the fact and not to the answer's schema fails here, not in a generated client."""
    import dataclasses

    from services.query.app import openapi_document
    from shared.facts import Fact

    schema = openapi_document()["components"]["schemas"]["Fact"]
    sent = {f.name for f in dataclasses.fields(Fact)} - {"centroid", "base_text"}
    assert set(schema["properties"]) == sent | {"score"}
    # to_data drops None values only: what cannot be None is always sent
    always = {f.name for f in dataclasses.fields(Fact) if "None" not in str(f.type)} & sent
    assert set(schema["required"]) == always


def test_no_documented_object_is_left_untyped():
    """An object whose members are known names them (a generator reads `{type: object}` as an empty
    object type): only the free-form ones listed here have no `properties`."""
    from services.query.app import openapi_document

    free = []

    def walk(node, where):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" not in node
                and "additionalProperties" not in node
            ):
                free.append(where)
            for k, v in node.items():
                walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}/{i}")

    walk(openapi_document(), "#")
    assert free == []


def test_the_document_has_the_docs_page_but_none_of_its_files():
    """The docs page's script, bundle, stylesheet and icon are served (the public paths above) but are no
    API operations: a client generator would make a method of each."""
    from services.query.app import openapi_document

    paths = openapi_document()["paths"]
    assert [p for p in paths if p.startswith("/docs/")] == []
    assert list(paths["/docs"]) == ["get"] and "/openapi.json" in paths


@pytest.mark.parametrize("below", [0.005, 0.02, 0.05, 0.3])
def test_common_count_is_where_a_terms_idf_falls_below_the_threshold(below: float) -> None:
    """The BM25 arm runs beside the idf counts in an index of at most `common_count` episodes: no term
    there may be common, and a term in one more episode than that is."""
    from services.query.recall import relevance

    edge = int(relevance.common_count(below))
    assert all(relevance.idf(n) >= below for n in range(max(0, edge - 50), edge + 1))
    assert relevance.idf(edge + 1) < below
    assert relevance.common_count(0.0) == float("inf")
