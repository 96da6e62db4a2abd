"""Calibrating `ENGRAM_FACTS_DISTANCE` per embedder on labelled task families.

`python -m bench.facts_calibration [--embedder hashing|minilm|mpnet|openai ...] [--scenes N] [-v]`

The corpus below holds 14 task families an agent meets (coding, data, operations, support, errands),
written as an agent records them: varied task descriptions and, per outcome, a solution or a failure
note, so an episode's embedding text (`shared.index.embedding_text`: the task, then the solution /
outcome details) varies within a family as much as recorded episodes do. The families fall into five
domains (`DOMAINS`); families of one domain share tools and words (a Postgres schema migration and a
slow Postgres query; a Docker CI build and a Kubernetes rollout) and are *related*, families of two
domains are *unrelated*.

For each embedder `measure()` embeds two draws of 8 episodes per family (16) and reports

- the family join height: the cosine distance at which average linkage joins all of a family's episodes
  into one group (its last merge height when clustered alone) — a threshold below it splits the family;
- the family pair distance: the mean cosine distance between two families' episodes (what average
  linkage compares before merging two whole families) — a threshold above it merges them;
- pairwise intra/inter distances (5th, 50th, 95th percentiles);
- scenes: random scopes of 5 families with 3..6 episodes each (the issue's case was 5 x 4), clustered
  at each threshold of a 0.01 grid: `right` (every family exactly one cluster, nothing mixed), `whole`
  (families that are one cluster), `one_fact` (families with exactly one pure cluster of >= 3 episodes)
  and `chained` (scenes holding a cluster of >= 3 episodes that mixes families). *Unrelated* scenes
  take one family per domain; *any* scenes take 5 of the 14 families.

The distributions overlap (a broad family's join height exceeds two related families' distance), so no
threshold is right everywhere. The rule: the largest threshold at which at most MAX_CHAINED (1%) of the
unrelated scenes hold a mixed fact — as many families whole as possible, unrelated ones not chained.
It is then checked on a third draw of the corpus (other task/note pairings, other scenes). The chosen
defaults live in `services.consolidator.facts_plan.DEFAULT_DISTANCE`; docs/architecture.md "Facts" records the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engram_episodic.events import Episode, Task

FAMILIES: dict[str, dict[str, Any]] = {
    "pg_migration": {
        "category": "coding",
        "tasks": [
            "Add a NOT NULL shipping_country column to the orders table with an Alembic migration",
            "Write the database migration that renames customers.phone to phone_number without downtime",
            "Create an Alembic revision adding an index on invoices(created_at) and backfill the new status column",
            "Split the users.full_name column into first_name and last_name in a Postgres schema migration",
            "Migrate the payments table from integer ids to UUID primary keys and update the foreign keys",
            "Alembic upgrade fails on staging: make the migration for the coupons table idempotent",
            "Drop the deprecated legacy_flags column from the accounts table in a reversible migration",
            "Change the price column of the products table from float to numeric(12,2) in a migration",
        ],
        "solutions": [
            "Added the column as nullable, backfilled it in batches of 10k rows, then set NOT NULL in a second "
            "migration; alembic upgrade head and downgrade -1 both pass on a copy of production.",
            "Wrote the migration with op.alter_column inside a transaction, added a data migration step and "
            "verified with alembic check that the models match the schema.",
            "Created the index CONCURRENTLY outside the transaction block and ran the backfill as a separate "
            "revision; the migration ran in 40 s on the staging database.",
        ],
        "failures": [
            "The migration timed out waiting for an ACCESS EXCLUSIVE lock on the table; rolled back.",
            "alembic upgrade failed: column already exists because an earlier revision was applied by hand.",
            "Foreign key constraint violation while backfilling; the downgrade path was broken as well.",
        ],
    },
    "pg_slow_query": {
        "category": "coding",
        "tasks": [
            "The admin dashboard query on the events table takes 9 seconds; make it fast",
            "Speed up the monthly revenue report query that does a sequential scan over order_items",
            "EXPLAIN ANALYZE shows a nested loop on the sessions join; fix the slow API endpoint /stats",
            "Reduce the p99 latency of the search-by-email query on the customers table",
            "The nightly aggregation job's GROUP BY over 50M rows in Postgres runs for hours",
            "Find why the orders listing page got slow after the last release and fix the query",
        ],
        "solutions": [
            "Added a composite index on (account_id, created_at) and rewrote the OR condition as a UNION; "
            "the query now takes 35 ms and uses an index scan.",
            "Replaced the correlated subquery with a lateral join and raised work_mem for the report role; "
            "EXPLAIN ANALYZE shows a hash join and 120 ms total.",
            "Created a materialized view refreshed every 10 minutes and pointed the endpoint at it.",
        ],
        "failures": [
            "The new index was not used by the planner because statistics were stale; still 8 s after ANALYZE.",
            "Rewriting the query changed the result set; the report totals no longer matched finance's numbers.",
            "Creating the index locked writes on the production table for 4 minutes; reverted.",
        ],
    },
    "flaky_ui_test": {
        "category": "testing",
        "tasks": [
            "Fix the flaky Cypress test for the login form submit button that fails one run in five",
            "The Playwright checkout test times out intermittently waiting for the pay button",
            "Stabilise the end-to-end test of the signup wizard that fails only in CI",
            "The React component test for the date picker fails randomly with element not found",
            "Selenium test for the search results page is flaky on Firefox; make it deterministic",
            "Our e2e suite has a flaky test on the password reset modal; find the race condition",
        ],
        "solutions": [
            "Replaced the fixed sleep with waiting for the network request to finish (cy.intercept + cy.wait) "
            "and asserted on the button being enabled; 200 consecutive runs green.",
            "Used a locator with auto-waiting and disabled CSS animations in the test config; the test passed "
            "100 times in a row in CI.",
            "Mocked the clock and awaited the debounced state update before asserting.",
        ],
        "failures": [
            "Still flaky: element not found after 4000 ms in 3 of 50 CI runs.",
            "Adding retries hid the failure locally but the test still timed out on the CI runner.",
            "Could not reproduce the race outside CI; the screenshot shows a spinner that never disappears.",
        ],
    },
    "docker_ci": {
        "category": "devops",
        "tasks": [
            "The Docker image build fails in GitHub Actions because libpq-dev is missing",
            "Cut the CI pipeline time: the docker build step reinstalls all pip dependencies every run",
            "GitLab CI job fails pushing the image to the registry with an authentication error",
            "Make the multi-stage Dockerfile produce an image under 200 MB for the api service",
            "The CI build breaks on ARM runners: the base image has no linux/arm64 variant",
            "Jenkins pipeline fails at the docker compose integration test stage with exit code 137",
        ],
        "solutions": [
            "Installed the build dependencies in the builder stage only and copied the wheels into a slim "
            "runtime image; the workflow is green and the image is 160 MB.",
            "Ordered the Dockerfile so requirements.txt is copied before the source and enabled the buildx "
            "layer cache in the workflow; the build dropped from 9 to 2 minutes.",
            "Rotated the registry token in the CI secrets and used docker/login-action before the push.",
        ],
        "failures": [
            "The build still fails: apt-get cannot find the package in the bookworm repository.",
            "The runner ran out of memory during the build and the job was killed (exit code 137).",
            "Cache never hits because the build context includes the .git directory; no speedup.",
        ],
    },
    "memory_leak": {
        "category": "debugging",
        "tasks": [
            "Find the memory leak in the Node.js websocket server whose RSS grows 1 GB per day",
            "The Python celery worker is OOM-killed after a few hours; locate what retains memory",
            "Java service heap keeps growing until GC pauses reach seconds; find the leak",
            "Our Go gRPC server leaks goroutines and memory under load; diagnose it",
            "The image resizing worker's memory never goes down after large uploads",
            "Investigate why the Rails app's memory doubles overnight and Puma workers get restarted",
        ],
        "solutions": [
            "Took two heap snapshots an hour apart; an event listener per connection was never removed. "
            "Removing it on close keeps RSS flat at 300 MB over 24 h.",
            "tracemalloc showed an unbounded module-level cache of parsed documents; replaced it with an LRU "
            "of 1000 entries and memory is stable.",
            "pprof goroutine profile showed blocked senders on an unbuffered channel; added context "
            "cancellation and the goroutine count stays flat.",
        ],
        "failures": [
            "Heap dumps did not show the growth; the leak seems to be in native memory, not found yet.",
            "Restarting workers every 100 tasks hides it but the root cause was not found.",
            "The profiler overhead made the service time out in production; aborted the investigation.",
        ],
    },
    "csv_etl": {
        "category": "data",
        "tasks": [
            "Load the daily sales CSV export from the S3 bucket into the warehouse table",
            "Write a pipeline that ingests the vendor's inventory CSV files into BigQuery every hour",
            "The ETL job that imports customer CSVs fails on rows with embedded newlines",
            "Convert the legacy Excel exports to parquet and load them into the data lake",
            "Deduplicate and load the clickstream CSV dumps into the Snowflake events table",
            "Build an Airflow DAG that picks up new CSV drops over SFTP and loads them into Postgres",
        ],
        "solutions": [
            "Parsed the files with pandas using explicit dtypes and quoting, validated the row counts and "
            "loaded them with COPY; 1.2M rows in 3 minutes, counts match the source.",
            "Used an Airflow sensor on the bucket prefix and a load job with schema autodetect disabled; "
            "duplicates removed with a MERGE on the natural key.",
            "Streamed the file in chunks of 100k rows and wrote parquet partitions by date.",
        ],
        "failures": [
            "The load failed: invalid UTF-8 byte sequence on line 48213 of the vendor file.",
            "Row counts did not match: 312 rows were silently dropped because of a bad delimiter.",
            "The job ran out of memory reading the 6 GB CSV into a single DataFrame.",
        ],
    },
    "oauth_login": {
        "category": "coding",
        "tasks": [
            "Add Google OAuth sign-in to the Django web app",
            "Users get redirect_uri_mismatch when logging in with GitHub OAuth on the staging domain",
            "Implement the OpenID Connect login flow with Okta for the internal admin portal",
            "Refresh tokens from Auth0 expire and users are logged out every hour; fix the session handling",
            "Add Sign in with Apple to the iOS app's backend authentication endpoint",
            "Migrate the login from username/password to SSO via Azure AD for employees",
        ],
        "solutions": [
            "Registered the callback URL, used django-allauth with the Google provider and stored the state "
            "parameter in the session; login works end to end on staging.",
            "Implemented the authorization code flow with PKCE, validated the id_token signature against the "
            "JWKS endpoint and mapped the groups claim to roles.",
            "Stored the refresh token server-side and renewed the access token five minutes before expiry.",
        ],
        "failures": [
            "invalid_grant: the authorization code was already used; the callback is called twice.",
            "The id_token signature check fails because the JWKS keys were cached after rotation.",
            "Login loops back to the sign-in page: the session cookie is dropped (SameSite=Strict).",
        ],
    },
    "k8s_deploy": {
        "category": "devops",
        "tasks": [
            "Roll out version 2.4 of the payments service to the Kubernetes staging cluster",
            "The deployment is stuck: pods of the api service are in CrashLoopBackOff after the helm upgrade",
            "Set up a canary release for the recommendation service with 10% of the traffic",
            "Pods get evicted on the production cluster; fix the resource requests and limits",
            "Deploy the new worker deployment with a horizontal pod autoscaler on queue length",
            "Roll back the failed release of the notification service and find out why readiness failed",
        ],
        "solutions": [
            "Applied the helm chart with the new image tag, waited for kubectl rollout status, and checked "
            "the readiness probes; all 6 replicas ready and error rate unchanged.",
            "The liveness probe hit a path that needed the database; pointed it at /healthz, raised the "
            "initialDelaySeconds, and the rollout completed.",
            "Configured an Argo Rollouts canary with analysis on the 5xx rate; promoted after 30 minutes.",
        ],
        "failures": [
            "Pods crash with OOMKilled right after start; the rollout was paused and rolled back.",
            "ImagePullBackOff: the image tag was not pushed to the cluster's registry.",
            "helm upgrade timed out waiting for the readiness probe; the old ReplicaSet kept serving.",
        ],
    },
    "email_digest": {
        "category": "coding",
        "tasks": [
            "Send the weekly digest email to all subscribers through SendGrid",
            "Transactional emails land in spam for Gmail users; fix SPF, DKIM and DMARC",
            "Build the HTML template for the order confirmation email with the line items",
            "The password reset email is sent twice; make the mail job idempotent",
            "Add an unsubscribe link and handle bounces for the newsletter mailing",
            "Batch the marketing emails so we stay under Mailgun's rate limit",
        ],
        "solutions": [
            "Rendered the template with the user's top items, sent via the SendGrid API in batches of 1000 "
            "with a dedup key per user and week; delivery rate 99.2%.",
            "Published the DKIM key in DNS, aligned the From domain and set a DMARC policy; mail-tester "
            "score went from 4/10 to 10/10.",
            "Stored a sent marker per message id before enqueueing; retries no longer send duplicates.",
        ],
        "failures": [
            "SendGrid returned 429 too many requests and half of the digest was not delivered.",
            "The template rendered broken in Outlook: the table layout collapsed.",
            "Emails still go to spam: the DKIM signature fails because of a DNS typo.",
        ],
    },
    "i18n": {
        "category": "frontend",
        "tasks": [
            "Translate the checkout page strings into German and French",
            "Add right-to-left layout support for the Arabic version of the settings screen",
            "Extract the hard-coded English strings of the onboarding flow into translation files",
            "Dates and currencies are shown in US format for Japanese users; localise them",
            "Plural forms are wrong in the Polish translation of the notifications panel",
            "Set up the translation workflow with Crowdin for the mobile app's string resources",
        ],
        "solutions": [
            "Wrapped the strings in t() calls, added de.json and fr.json with reviewed translations and a "
            "language switcher; screenshots checked in both languages.",
            "Used Intl.DateTimeFormat and Intl.NumberFormat with the user's locale instead of moment's "
            "default; the Japanese UI shows yen and year-month-day dates.",
            "Switched to ICU message format with plural categories one/few/many/other.",
        ],
        "failures": [
            "Layout broke: the German labels are too long and overflow the buttons.",
            "Missing translation keys show up as raw identifiers on the French page.",
            "The RTL mirroring flipped the icons that must not be mirrored; reverted.",
        ],
    },
    "flight_booking": {
        "category": "errands",
        "tasks": [
            "Book a flight from Berlin to Lisbon for the conference on March 14, returning on the 17th",
            "Find the cheapest direct flight from London to New York next Friday morning",
            "Rebook my cancelled Lufthansa flight to Munich for tomorrow",
            "Book two economy seats to Barcelona with checked luggage for the family trip",
            "Change the return date of my flight to Tokyo to one day later",
            "Find a flight to San Francisco that arrives before 6 pm and costs under 600 euros",
        ],
        "solutions": [
            "Compared fares on three airlines, booked TAP TP543 at 189 EUR with a seat selection and sent "
            "the confirmation and e-ticket to the user's calendar.",
            "Booked the 8:40 British Airways departure in economy light; confirmation code sent by email.",
            "Rebooked through the airline's app onto the 7:15 departure at no extra cost.",
        ],
        "failures": [
            "The booking failed at payment: the card was declined by 3-D Secure.",
            "No seats left in the fare class; the price rose to 890 euros before booking.",
            "The airline site required a phone call to change the date; could not complete it.",
        ],
    },
    "refund_support": {
        "category": "support",
        "tasks": [
            "Answer a customer asking for a refund for a damaged blender that arrived broken",
            "Handle the complaint of a customer charged twice for the same order",
            "A customer wants to return shoes after the 30-day window; reply politely with the policy",
            "Process the refund for order 48213 whose parcel was lost by the courier",
            "Respond to an angry customer whose subscription renewed without notice and who wants money back",
            "Resolve the ticket of a user whose gift card balance disappeared after a refund",
        ],
        "solutions": [
            "Apologised, issued a full refund to the original payment method and sent a prepaid return "
            "label; the customer rated the conversation 5 stars.",
            "Confirmed the duplicate charge in the payment provider, refunded the second charge and "
            "explained it takes 3-5 business days.",
            "Offered store credit as a goodwill gesture under the return policy exception.",
        ],
        "failures": [
            "The refund could not be issued: the order is older than the payment provider allows.",
            "The customer escalated to a chargeback before our reply; the ticket was reopened.",
            "Gave the wrong policy information and the supervisor had to correct the reply.",
        ],
    },
    "spreadsheet_report": {
        "category": "analysis",
        "tasks": [
            "Summarise quarterly revenue by region from the finance spreadsheet",
            "Build a pivot table of support tickets per product and month from the exported sheet",
            "Compute the churn rate per customer cohort from the subscriptions workbook",
            "Make a chart of weekly active users from the Google Sheet the growth team keeps",
            "Reconcile the expenses sheet against the bank statement and list the mismatches",
            "Prepare the board slide with year-over-year sales growth by product line",
        ],
        "solutions": [
            "Loaded the sheet, grouped revenue by region and quarter and wrote a summary table with totals; "
            "EMEA grew 12% quarter over quarter. Numbers cross-checked with finance.",
            "Built the pivot with months as columns, added a line chart and shared the sheet with comments "
            "on the two outlier months.",
            "Matched transactions by date and amount, flagged 7 mismatches with their row numbers.",
        ],
        "failures": [
            "The totals did not match the finance report because of duplicated rows in the export.",
            "Several cells hold text instead of numbers, so the SUM formulas were wrong.",
            "Could not open the workbook: the sheet is protected and no access was granted.",
        ],
    },
    "api_docs": {
        "category": "docs",
        "tasks": [
            "Write the API documentation for the /invoices endpoint of the billing service",
            "Document the request and response fields of the POST /orders endpoint in the OpenAPI spec",
            "Add code examples in Python and curl to the payments API reference",
            "The API docs of the webhooks endpoint are outdated; update them for version 2",
            "Generate reference docs for the Python SDK from its docstrings with Sphinx",
            "Explain the authentication flow of the public API with examples in the developer portal",
        ],
        "solutions": [
            "Wrote the OpenAPI description with request and response examples and error codes, reviewed by "
            "the billing team and published on the developer portal.",
            "Documented every field with its type and constraints, added a curl example per status code and "
            "checked them against the staging API.",
            "Configured sphinx-autodoc with napoleon, fixed the broken cross-references and published to "
            "Read the Docs.",
        ],
        "failures": [
            "The docs build fails: autodoc cannot import the package because of a missing dependency.",
            "Reviewers rejected the page: the examples use the deprecated v1 endpoints.",
            "The documented error codes do not match what the endpoint returns; the review sent it back.",
        ],
    },
}

DOMAINS: dict[str, tuple[str, ...]] = {
    # families of one domain are related (same tools, same words): a scene of "unrelated" families takes
    # at most one family per domain
    "data": ("pg_migration", "pg_slow_query", "csv_etl", "spreadsheet_report"),
    "operations": ("docker_ci", "k8s_deploy", "memory_leak"),
    "frontend": ("flaky_ui_test", "i18n"),
    "backend": ("oauth_login", "email_digest", "api_docs"),
    "customers": ("flight_booking", "refund_support"),
}
MAX_CHAINED = 0.01
"""The share of scenes of unrelated families allowed to hold a fact mixing two of them."""
NEAR_PAIRS = (
    ("pg_migration", "pg_slow_query"),
    ("docker_ci", "k8s_deploy"),
    ("flight_booking", "refund_support"),
)


def episodes(family: str, n: int, *, seed: int = 0) -> list[Episode]:
    """`n` episodes of one family: tasks in turn, success (solution) or failure (failure note) alternating
    in a seeded order, so an episode's embedding text looks like a recorded one."""
    spec = FAMILIES[family]
    rng = random.Random(f"{family}:{seed}")
    tasks = list(spec["tasks"])
    rng.shuffle(tasks)
    out = []
    for i in range(n):
        ok = rng.random() < 0.6
        notes = spec["solutions"] if ok else spec["failures"]
        ep = Episode(
            episode_id=f"{family}-{seed}-{i}",
            task=Task(description=tasks[i % len(tasks)], category=spec["category"]),
            outcome="success" if ok else "failure",
            solution=rng.choice(notes) if ok else None,
            outcome_details=None if ok else rng.choice(notes),
        )
        out.append(ep)
    return out


def corpus(per_family: int = 8, *, seed: int = 0) -> tuple[list[Episode], list[str]]:
    """Every family's `per_family` episodes and their labels."""
    eps, labels = [], []
    for family in FAMILIES:
        for e in episodes(family, per_family, seed=seed):
            eps.append(e)
            labels.append(family)
    return eps, labels


def cosine_distances(vectors: np.ndarray) -> np.ndarray:
    v = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.clip(1.0 - v @ v.T, 0.0, 2.0)


def join_height(dist: np.ndarray) -> float:
    """The average-linkage height at which all rows of `dist` form one group."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    if len(dist) < 2:
        return 0.0
    return float(linkage(squareform(dist, checks=False), method="average")[-1, 2])


@dataclass(frozen=True)
class Score:
    """How clustering at one threshold did over a set of scenes."""

    right: float
    """scenes where every family is exactly one cluster and no cluster mixes families"""
    whole: float
    """families that are exactly one cluster"""
    one_fact: float
    """families with exactly one pure cluster of >= min_cluster episodes (one fact of their own)"""
    chained: float
    """scenes with a cluster of >= min_cluster episodes mixing families (a fact about two families)"""


def score(
    vectors: np.ndarray,
    labels: Sequence[str],
    scenes: Sequence[Sequence[int]],
    threshold: float,
    min_cluster: int = 3,
) -> Score:
    from services.consolidator.facts_plan import cluster

    right = whole = one_fact = chained = families = 0
    for rows in scenes:
        lab = [labels[i] for i in rows]
        groups = [set(g) for g in cluster(vectors[list(rows)], threshold)]
        mixed = any(len(g) >= min_cluster and len({lab[i] for i in g}) > 1 for g in groups)
        chained += mixed
        ok = not mixed
        for fam in set(lab):
            members = {i for i, x in enumerate(lab) if x == fam}
            families += 1
            is_whole = members in groups
            whole += is_whole
            ok = ok and is_whole
            pure = [g for g in groups if len(g) >= min_cluster and {lab[i] for i in g} == {fam}]
            one_fact += len(pure) == 1
        right += ok
    n = max(1, len(scenes))
    return Score(right / n, whole / max(1, families), one_fact / max(1, families), chained / n)


def scenes(
    labels: Sequence[str],
    n: int,
    *,
    unrelated: bool,
    seed: int = 1,
    families: int = 5,
    sizes: tuple[int, int] = (3, 6),
) -> list[list[int]]:
    """Random scopes of `families` families with `sizes` episodes each (row indices into the corpus);
    `unrelated` takes at most one family per domain."""
    rng = random.Random(f"{seed}:{unrelated}")
    fams = sorted(set(labels), key=list(labels).index)
    idx = {f: [i for i, x in enumerate(labels) if x == f] for f in fams}
    out = []
    for _ in range(n):
        if unrelated:
            chosen = [rng.choice(DOMAINS[d]) for d in rng.sample(sorted(DOMAINS), families)]
        else:
            chosen = rng.sample(fams, families)
        out.append([i for f in chosen for i in rng.sample(idx[f], rng.randint(*sizes))])
    return out


@dataclass
class Measurement:
    embedder: str
    labels: list[str]
    intra_join: list[float]
    inter_mean: list[float]
    pair_intra: tuple[float, ...]
    pair_inter: tuple[float, ...]
    near_inter: dict[str, float]
    unrelated: list[tuple[float, Score]]
    mixed: list[tuple[float, Score]]
    best: float
    best_range: tuple[float, float]

    def at(self, t: float) -> tuple[Score, Score]:
        pick = min(range(len(self.unrelated)), key=lambda i: abs(self.unrelated[i][0] - t))
        return self.unrelated[pick][1], self.mixed[pick][1]

    def summary(self) -> dict[str, Any]:
        def q(xs):
            return {
                "min": round(min(xs), 3),
                "median": round(float(np.median(xs)), 3),
                "max": round(max(xs), 3),
            }

        def sc(x: Score) -> dict[str, float]:
            return {k: round(v, 3) for k, v in vars(x).items()}

        u, m = self.at(self.best)
        u5, m5 = self.at(0.5)
        return {
            "embedder": self.embedder,
            "episodes": len(self.labels),
            "families": len(set(self.labels)),
            "family_join_height": q(self.intra_join),
            "family_pair_mean_distance": q(self.inter_mean),
            "pairwise_intra_p5_p50_p95": [round(x, 3) for x in self.pair_intra],
            "pairwise_inter_p5_p50_p95": [round(x, 3) for x in self.pair_inter],
            "near_pairs_mean_distance": {k: round(v, 3) for k, v in self.near_inter.items()},
            "threshold": round(self.best, 3),
            "unchained_range": [round(x, 2) for x in self.best_range],
            "unrelated_scenes_at_threshold": sc(u),
            "any_scenes_at_threshold": sc(m),
            "unrelated_scenes_at_0.5": sc(u5),
            "any_scenes_at_0.5": sc(m5),
        }


def measure(
    name: str,
    vectors: np.ndarray,
    labels: Sequence[str],
    *,
    n_scenes: int = 300,
    seed: int = 1,
    grid: Sequence[float] | None = None,
) -> Measurement:
    """Intra/inter figures, and per threshold how random 5-family scenes cluster. The threshold is the
    largest grid point at which at most MAX_CHAINED of the scenes of unrelated families hold a fact that
    mixes two families (as many families as possible come out whole, and unrelated ones are not chained)."""
    labels = list(labels)
    dist = cosine_distances(vectors)
    fams = sorted(set(labels), key=labels.index)
    idx = {f: [i for i, x in enumerate(labels) if x == f] for f in fams}
    intra_join = [join_height(dist[np.ix_(idx[f], idx[f])]) for f in fams]
    inter_mean = [float(dist[np.ix_(idx[a], idx[b])].mean()) for a, b in itertools.combinations(fams, 2)]
    same = np.array([[x == y for y in labels] for x in labels])
    upper = np.triu(np.ones_like(same, dtype=bool), 1)
    pi, pe = dist[same & upper], dist[~same & upper]
    near = {f"{a}~{b}": float(dist[np.ix_(idx[a], idx[b])].mean()) for a, b in NEAR_PAIRS}
    unrelated_scenes = scenes(labels, n_scenes, unrelated=True, seed=seed)
    any_scenes = scenes(labels, n_scenes, unrelated=False, seed=seed)
    grid = list(grid) if grid is not None else [round(0.3 + 0.01 * k, 2) for k in range(71)]
    unrelated = [(t, score(vectors, labels, unrelated_scenes, t)) for t in grid]
    mixed = [(t, score(vectors, labels, any_scenes, t)) for t in grid]
    # the largest threshold at which facts about two unrelated families stay (almost) absent: past it,
    # more families come out whole, but some facts start to blend two of them
    allowed = [t for t, s in unrelated if s.chained <= MAX_CHAINED]
    best = max(allowed) if allowed else grid[0]
    best_range = (min(allowed) if allowed else grid[0], best)
    return Measurement(
        name,
        labels,
        intra_join,
        inter_mean,
        tuple(float(np.percentile(pi, p)) for p in (5, 50, 95)),
        tuple(float(np.percentile(pe, p)) for p in (5, 50, 95)),
        near,
        unrelated,
        mixed,
        best,
        best_range,
    )


async def embed_corpus(embedder, per_family: int = 8, *, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    from shared.index import embedding_text

    eps, labels = corpus(per_family, seed=seed)
    return await embedder.embed([embedding_text(e) for e in eps]), labels


def _make(name: str, dim: int):
    from shared.embedding import HashingEmbedder, MiniLMEmbedder, MPNetEmbedder, make_embedder
    from shared.settings import Settings

    if name == "hashing":
        return HashingEmbedder(dim)
    if name == "minilm":
        return MiniLMEmbedder()
    if name == "mpnet":
        return MPNetEmbedder()
    return make_embedder(
        Settings.from_env(os.environ).with_(embedder="openai")
    )  # ENGRAM_OPENAI_URL / _MODEL / _API_KEY


def held_out(
    vectors: np.ndarray, labels: Sequence[str], threshold: float, n_scenes: int
) -> tuple[Score, Score]:
    """Scores at `threshold` on a draw of the corpus not calibrated on (other task/note pairings, scenes)."""
    return (
        score(vectors, labels, scenes(labels, n_scenes, unrelated=True, seed=7), threshold),
        score(vectors, labels, scenes(labels, n_scenes, unrelated=False, seed=7), threshold),
    )


async def _main(names: Sequence[str], n_scenes: int, dim: int, verbose: bool) -> None:
    for name in names:
        embedder = _make(name, dim)
        try:  # two draws to calibrate on (16 episodes per family), a third to check the choice on
            v0, l0 = await embed_corpus(embedder, seed=0)
            v1, l1 = await embed_corpus(embedder, seed=1)
            other, other_labels = await embed_corpus(embedder, seed=2)
        finally:
            await embedder.aclose()
        vectors, labels = np.concatenate([v0, v1]), l0 + l1
        m = measure(embedder.name, np.asarray(vectors, dtype=np.float64), labels, n_scenes=n_scenes)
        out = m.summary()
        u, a = held_out(np.asarray(other, dtype=np.float64), other_labels, m.best, n_scenes)
        out["held_out_at_threshold"] = {
            "unrelated": {k: round(v, 3) for k, v in vars(u).items()},
            "any": {k: round(v, 3) for k, v in vars(a).items()},
        }
        print(json.dumps(out))
        if verbose:
            for (t, u), (_, a) in zip(m.unrelated, m.mixed, strict=True):
                print(
                    f"  {t:.2f}  unrelated: right {u.right:.2f} whole {u.whole:.2f} one fact {u.one_fact:.2f} "
                    f"chained {u.chained:.2f}  |  any: right {a.right:.2f} whole {a.whole:.2f} "
                    f"one fact {a.one_fact:.2f} chained {a.chained:.2f}"
                )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--embedder", action="append", choices=["hashing", "minilm", "mpnet", "openai"])
    p.add_argument("--scenes", type=int, default=300)
    p.add_argument("--dim", type=int, default=384, help="the hashing embedder's dimension")
    p.add_argument("-v", "--verbose", action="store_true", help="print every threshold of the grid")
    a = p.parse_args()
    asyncio.run(_main(a.embedder or ["hashing", "minilm", "mpnet"], a.scenes, a.dim, a.verbose))
