"""A generated sample data set: realistic JSON documents of a small shop, made locally.

Theory of operation
-------------------
The main job needs data that looks like what people store in a document database: customers,
products and orders that refer to each other, with nested objects, arrays, timestamps and a
``type`` field to tell them apart. Everything is drawn from a seeded ``random.Random``, so the
same seed gives byte-identical documents (tests rely on it) and no file is downloaded.

:func:`documents` yields ``(key, json_bytes)`` pairs; keys are ``type::NNNNNN``. After the first
load, :func:`changes` yields a stream of realistic updates for the live part of the demo: orders
change status, customers move, products change price, and some orders are cancelled (deleted).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

FIRST_NAMES = [
    "Ada",
    "Alan",
    "Barbara",
    "Claude",
    "Dennis",
    "Edsger",
    "Frances",
    "Grace",
    "Hedy",
    "Ivan",
    "John",
    "Katherine",
    "Linus",
    "Margaret",
    "Niklaus",
    "Radia",
    "Shafi",
    "Tim",
    "Whitfield",
    "Yukihiro",
    "Leslie",
    "Donald",
    "Ken",
    "Barbara",
    "Jean",
    "Sophie",
    "Anita",
]
LAST_NAMES = [
    "Lovelace",
    "Turing",
    "Liskov",
    "Shannon",
    "Ritchie",
    "Dijkstra",
    "Allen",
    "Hopper",
    "Lamarr",
    "Sutherland",
    "Backus",
    "Johnson",
    "Torvalds",
    "Hamilton",
    "Wirth",
    "Perlman",
    "Goldwasser",
    "Berners-Lee",
    "Diffie",
    "Matsumoto",
    "Lamport",
    "Knuth",
    "Thompson",
    "Wilson",
    "Bartik",
    "Wilson",
    "Borg",
]
CITIES = (
    ("Paris", "FR"), ("Lyon", "FR"), ("Berlin", "DE"), ("Munich", "DE"), ("Madrid", "ES"),
    ("Lisbon", "PT"), ("Rome", "IT"), ("Milan", "IT"), ("London", "GB"), ("Dublin", "IE"),
    ("Oslo", "NO"), ("Warsaw", "PL"), ("Prague", "CZ"), ("Vienna", "AT"), ("Zurich", "CH"),
)  # fmt: skip
CATEGORIES = ("books", "music", "garden", "kitchen", "toys", "outdoor", "office", "games")
ADJECTIVES = ("compact", "classic", "deluxe", "eco", "pro", "mini", "vintage", "smart")
NOUNS = ("lamp", "kettle", "chair", "notebook", "speaker", "tent", "puzzle", "backpack", "mug")
STATUSES = ("placed", "paid", "shipped", "delivered")
EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Sizes:
    customers: int
    products: int
    orders: int

    @classmethod
    def for_total(cls, total: int) -> Sizes:
        """Split ``total`` documents 20% customers, 10% products, 70% orders (at least 1 each)."""
        customers = max(1, total // 5)
        products = max(1, total // 10)
        return cls(customers, products, max(1, total - customers - products))

    @property
    def total(self) -> int:
        return self.customers + self.products + self.orders


def _key(kind: str, n: int) -> bytes:
    return f"{kind}::{n:06d}".encode()


def _dump(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def customer(rng: random.Random, n: int) -> dict:
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    city, country = rng.choice(CITIES)
    return {
        "type": "customer",
        "id": n,
        "name": f"{first} {last}",
        "email": f"{first.lower()}.{last.lower()}{n}@example.org",
        "address": {"city": city, "country": country},
        "since": EPOCH + rng.randrange(365 * 86400),
        "vip": rng.random() < 0.1,
    }


def product(rng: random.Random, n: int) -> dict:
    return {
        "type": "product",
        "id": n,
        "name": f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}",
        "category": rng.choice(CATEGORIES),
        "price": round(rng.uniform(2, 300), 2),
        "stock": rng.randrange(0, 500),
    }


def order(rng: random.Random, n: int, sizes: Sizes) -> dict:
    lines = [
        {"product": rng.randrange(sizes.products), "qty": rng.randint(1, 4),
         "price": round(rng.uniform(2, 300), 2)}
        for _ in range(rng.randint(1, 5))
    ]  # fmt: skip
    city, country = rng.choice(CITIES)
    return {
        "type": "order",
        "id": n,
        "customer": rng.randrange(sizes.customers),
        "lines": lines,
        "total": round(sum(line["qty"] * line["price"] for line in lines), 2),
        "status": rng.choice(STATUSES),
        "ship_to": {"city": city, "country": country},
        "placed_at": EPOCH + rng.randrange(300 * 86400),
    }


def documents(total: int, seed: int = 42) -> Iterator[tuple[bytes, bytes]]:
    """``total`` documents as (key, JSON bytes), the same for the same seed."""
    rng = random.Random(seed)
    sizes = Sizes.for_total(total)
    for n in range(sizes.customers):
        yield _key("customer", n), _dump(customer(rng, n))
    for n in range(sizes.products):
        yield _key("product", n), _dump(product(rng, n))
    for n in range(sizes.orders):
        yield _key("order", n), _dump(order(rng, n, sizes))


def changes(total: int, seed: int = 7) -> Iterator[tuple[bytes, bytes | None]]:
    """An endless stream of updates to a data set of ``total`` documents: ``(key, doc)`` to
    write, or ``(key, None)`` to delete (a cancelled order)."""
    rng = random.Random(seed)
    sizes = Sizes.for_total(total)
    next_order = sizes.orders
    while True:
        roll = rng.random()
        if roll < 0.4:
            n = rng.randrange(sizes.orders)
            doc = order(rng, n, sizes)
            doc["status"] = rng.choice(STATUSES[1:])
            yield _key("order", n), _dump(doc)
        elif roll < 0.6:
            yield _key("order", next_order), _dump(order(rng, next_order, sizes))
            next_order += 1
        elif roll < 0.75:
            n = rng.randrange(sizes.customers)
            yield _key("customer", n), _dump(customer(rng, n))
        elif roll < 0.9:
            n = rng.randrange(sizes.products)
            yield _key("product", n), _dump(product(rng, n))
        else:
            yield _key("order", rng.randrange(next_order)), None
