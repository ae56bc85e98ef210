"""Sentence templates for the ``similarity`` suite: paraphrases of one fact vs unrelated facts.

Each topic has templates that say the same thing in different words; filling two templates of
one topic with the same slot values gives a paraphrase pair, while a template of another topic
gives an unrelated sentence (it may share a name, so word overlap alone cannot solve the suite).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SLOTS: dict[str, tuple[str, ...]] = {
    "person": ("Anna", "Ben", "Carlos", "Dana", "Emil", "Fatima", "Grace", "Hiro", "Ines", "Jonas", "Kofi", "Lena"),
    "city": ("Paris", "Lagos", "Lima", "Oslo", "Seoul", "Cairo", "Denver", "Perth", "Quito", "Vienna"),
    "item": ("laptop", "bicycle", "camera", "phone", "lamp", "guitar", "watch", "kettle", "printer"),
    "dish": ("pasta", "vegetable soup", "curry", "fried rice", "pancakes", "fish stew"),
    "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"),
    "subject": ("history", "astronomy", "gardening", "chess", "music", "volcanoes", "ancient Rome"),
    "hour": ("six", "seven", "eight", "nine", "ten"),
    "number": ("three", "five", "seven", "ten", "twelve", "fifteen"),
    "place": ("park", "backyard", "old garden", "courtyard", "school garden"),
}

TOPICS: dict[str, tuple[str, ...]] = {
    "rain": (
        "It is raining heavily in {city} today.",
        "Today {city} is getting a lot of rain.",
        "Heavy rain is falling over {city} today.",
    ),
    "train": (
        "The train to {city} leaves at {hour} o'clock.",
        "At {hour} o'clock the train departs for {city}.",
        "The {city} train departs at {hour}.",
    ),
    "purchase": (
        "{person} bought a new {item} yesterday.",
        "Yesterday {person} purchased a new {item}.",
        "A new {item} was bought by {person} yesterday.",
    ),
    "repair": (
        "{person} fixed the broken {item} this morning.",
        "This morning the broken {item} was repaired by {person}.",
        "{person} repaired the {item} that was broken, earlier this morning.",
    ),
    "cooking": (
        "{person} is cooking {dish} for dinner tonight.",
        "Tonight {person} will make {dish} for dinner.",
        "For dinner this evening, {person} is preparing {dish}.",
    ),
    "meeting": (
        "The meeting with {person} was moved to {day}.",
        "{person}'s meeting has been rescheduled for {day}.",
        "We now meet {person} on {day} instead.",
    ),
    "lost": (
        "{person} cannot find the {item} anywhere.",
        "{person} has lost the {item} and is searching for it.",
        "The {item} is missing and {person} is looking everywhere for it.",
    ),
    "reading": (
        "{person} is reading a book about {subject}.",
        "{person} reads a book on the topic of {subject}.",
        "A book about {subject} is what {person} is reading.",
    ),
    "match": (
        "Our team won the match by {number} points.",
        "We were victorious, winning the game by {number} points.",
        "The game ended in our favour, {number} points ahead.",
    ),
    "cold": (
        "{person} has a bad cold and stayed home.",
        "{person} stayed at home because of a bad cold.",
        "Because of a heavy cold, {person} did not leave the house.",
    ),
    "garden": (
        "The roses in the {place} are blooming early this year.",
        "This year the roses bloom early in the {place}.",
        "Roses in the {place} have flowered sooner than usual this year.",
    ),
    "price": (
        "The price of a {item} went up by {number} percent.",
        "A {item} now costs {number} percent more than before.",
        "Buying a {item} has become {number} percent more expensive.",
    ),
}


@dataclass(frozen=True)
class Triplet:
    """An anchor sentence, a paraphrase of it, and an unrelated sentence."""

    anchor: str
    paraphrase: str
    unrelated: str
    topic: str
    unrelated_topic: str


def triplet(rng: random.Random) -> Triplet:
    """Draw one triplet: two templates of one topic with the same slots, one of another topic."""
    topic, other = rng.sample(sorted(TOPICS), 2)
    first, second = rng.sample(TOPICS[topic], 2)
    values = {name: rng.choice(SLOTS[name]) for name in SLOTS}
    unrelated_values = {name: rng.choice(SLOTS[name]) for name in SLOTS}
    # Sharing the person's name makes the unrelated sentence look similar on the surface.
    unrelated_values["person"] = values["person"]
    return Triplet(
        anchor=first.format(**values),
        paraphrase=second.format(**values),
        unrelated=rng.choice(TOPICS[other]).format(**unrelated_values),
        topic=topic,
        unrelated_topic=other,
    )
