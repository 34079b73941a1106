"""Seeded generator for the shipped demo records (``tuning/assets/records.jsonl``, package data;
``data/records.jsonl`` is a link to it, so there is one copy).

Run ``python data/make_records.py`` to rebuild the file; the output is byte-for-byte
the same for the same seed. The records imitate a product catalogue / support
desk feed: structured fields plus a free-text body whose length is long-tailed
like real traffic (log-normal word counts: median ~30 words, p99 > 200, a few
beyond the model's 256-token limit), with punctuation, numbers, units, model
codes, out-of-vocabulary words and some non-ASCII text (accents, CJK, emoji).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

CATEGORIES = {
    "headphones": ["Wireless", "Noise-cancelling", "Over-ear", "In-ear", "Studio"],
    "laptop": ["Ultrabook", "Gaming", "Business", "2-in-1", "Workstation"],
    "coffee-maker": ["Espresso", "Drip", "Pour-over", "Cold-brew", "Capsule"],
    "running-shoes": ["Trail", "Road", "Racing", "Cushioned", "Minimalist"],
    "router": ["Mesh", "Wi-Fi 6E", "Dual-band", "Travel", "Gaming"],
    "blender": ["High-speed", "Personal", "Immersion", "Countertop", "Vacuum"],
    "support-ticket": ["Billing", "Login", "Shipping", "Refund", "Warranty"],
}
BRANDS = ["Acme", "Zentrix", "Nordvik", "Kumo", "Lumière", "Brauhaus", "Orvane", "Quillo", "Sørensen", "Taiyō"]
COLORS = ["black", "white", "graphite", "sand", "navy", "olive", "crimson", "champagne"]
ATTRIBUTE_KEYS = ["color", "weight", "warranty", "sku", "power", "capacity", "origin", "rating"]
WORDS = (
    "the a an and or but with without for to from of in on at by is are was were be been this that these those "
    "it its they them we our you your quality battery sound noise comfort fit size price delivery order refund "
    "screen keyboard fan cable charger box manual setup firmware update connection signal speed range water "
    "steel plastic foam mesh grip sole heel toe blade jar motor lid button display app account password email "
    "invoice payment card charge week day month year after before during since while because however although "
    "really very quite too slightly extremely fast slow loud quiet warm cold heavy light cheap expensive good bad "
    "great terrible excellent poor durable fragile easy hard simple complicated returned replaced broken works "
    "stopped started arrived shipped missing damaged perfect fine okay decent amazing disappointing recommend "
    "would could should never always sometimes again still already just only also even maybe"
).split()
# Words a BERT vocabulary splits into several pieces or cannot represent at all.
RARE_WORDS = [
    "unboxing", "overheats", "firmwares", "bluetoothy", "ergonomical", "doohickey", "reconnectivity",
    "hypercharged", "thermoplastic", "antimicrobially", "gyroscopically", "vibrationless", "smartwatchy",
    "supercalifragilistic", "Xyloquartz", "Brrrrrr", "zzzzzzzzzz",
]
ACCENTED = ["café", "naïve", "crème brûlée", "Zürich", "São Paulo", "déjà vu", "piñata", "façade", "Ångström", "Øresund"]
CJK = ["非常好", "质量不错", "送货很快", "電池が長持ち", "音がいい", "배송이 빨라요", "価格は高い", "很满意"]
EMOJI = ["😀", "👍", "🔥", "😡", "⭐", "🎧", "☕", "💯"]
PUNCT_ENDINGS = [".", "!", "?", "...", "!!", ";", ":)"]


def _word_count(rng: random.Random) -> int:
    # log-normal: median e^3.4 ~ 30 words; sigma chosen so p99 lands above 200 words.
    return max(3, int(round(rng.lognormvariate(math.log(30), 0.88))))


def _token(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.80:
        return rng.choice(WORDS)
    if roll < 0.86:
        return rng.choice(RARE_WORDS)
    if roll < 0.92:
        return rng.choice([f"{rng.randint(1, 999)}", f"{rng.uniform(0.1, 99):.1f}kg", f"{rng.randint(2, 48)}h",
                           f"${rng.randint(5, 2500)}.{rng.randint(0, 99):02d}", f"#{rng.randint(1000, 99999)}",
                           f"{rng.randint(10, 99)}%", f"v{rng.randint(1, 9)}.{rng.randint(0, 20)}"])
    if roll < 0.95:
        return rng.choice(ACCENTED)
    if roll < 0.97:
        return rng.choice(CJK)
    if roll < 0.985:
        return rng.choice(EMOJI)
    return rng.choice(["(see photo)", "[edit]", "e-mail", "re-ordered", "can't", "won't", "it's", "A/B", "USB-C", "50/50"])


def _body(rng: random.Random, n_words: int) -> str:
    sentences, current = [], []
    for _ in range(n_words):
        current.append(_token(rng))
        if len(current) >= rng.randint(6, 18):
            sentences.append(" ".join(current).capitalize() + rng.choice(PUNCT_ENDINGS))
            current = []
    if current:
        sentences.append(" ".join(current).capitalize() + ".")
    return " ".join(sentences)


def _attributes(rng: random.Random) -> dict[str, str]:
    keys = rng.sample(ATTRIBUTE_KEYS, rng.randint(1, 5))
    values = {
        "color": lambda: rng.choice(COLORS),
        "weight": lambda: f"{rng.uniform(0.1, 12):.2f} kg",
        "warranty": lambda: f"{rng.choice([1, 2, 3, 5])} years",
        "sku": lambda: f"{rng.choice('ABCDEFGHJK')}{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        "power": lambda: f"{rng.randint(5, 2200)} W",
        "capacity": lambda: f"{rng.choice([0.5, 1, 1.5, 2, 64, 128, 512])} {rng.choice(['L', 'GB'])}",
        "origin": lambda: rng.choice(["Germany", "Japan", "Viet Nam", "México", "Côte d'Ivoire", "中国"]),
        "rating": lambda: f"{rng.randint(1, 5)}/5",
    }
    return {k: values[k]() for k in keys}


def make_record(rng: random.Random, index: int) -> dict:
    category = rng.choice(sorted(CATEGORIES))
    kind = rng.choice(CATEGORIES[category])
    brand = rng.choice(BRANDS)
    title = f"{brand} {kind} {category.replace('-', ' ')} {rng.choice(['Pro', 'Max', 'Lite', 'X', 'Mini', '2', '3'])}"
    return {
        "id": f"rec-{index:05d}",
        "title": title,
        "category": category,
        "attributes": _attributes(rng),
        "body": _body(rng, _word_count(rng)),
    }


def make_records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [make_record(rng, i) for i in range(n)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2400, help="number of records")
    parser.add_argument("--seed", type=int, default=20261130)
    default_out = Path(__file__).resolve().parent.parent / "tuning" / "assets" / "records.jsonl"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    with args.out.open("w", encoding="utf-8", newline="\n") as fh:
        for record in make_records(args.n, args.seed):
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"wrote {args.n} records to {args.out}")


if __name__ == "__main__":
    main()
