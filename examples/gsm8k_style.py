#!/usr/bin/env python3
"""Writes GSM8K-format grade-school word problems in verl's JSONL layout (no downloads).

    python3 examples/gsm8k_style.py --out examples/data/gsm8k-style [--train 200] [--test 50] [--seed 0]

Each problem is a short story with two or three arithmetic steps and an integer answer. A row:

    {"data_source": "gsm8k-style",
     "prompt": [{"role": "user", "content": QUESTION + " Let's think step by step and output the final answer after \\"####\\"."}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "42"},
     "extra_info": {"split": "train", "index": 0, "question": QUESTION, "answer": SOLUTION}}

SOLUTION is worked in GSM8K's style, with <<a*b=c>> calculator annotations and a last line
"#### 42". The output depends only on the arguments: the same seed writes the same bytes
(examples/data/gsm8k-style is this script's output with the defaults).
"""
import argparse
import json
import os
import random

NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Mark", "Ken", "Alexis", "Tina", "Randy", "Joy"]
ITEMS = ["clips", "apples", "stickers", "marbles", "cookies", "pencils", "cards", "shells"]
INSTRUCTION = " Let's think step by step and output the final answer after \"####\"."


def pronoun(name):
    return "she" if name in ("Natalia", "Betty", "Julie", "Alexis", "Tina", "Joy") else "he"


def buy_and_give(r):
    name, item, friend = r.choice(NAMES), r.choice(ITEMS), r.choice(NAMES)
    a, b = r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b - 1)
    q = (f"{name} has {a} {item}. {pronoun(name).capitalize()} buys {b} more and then gives {c} to {friend}. "
         f"How many {item} does {name} have now?")
    s = [f"After buying, {name} has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} {item}.",
         f"After giving {c} away, {pronoun(name)} has {a + b}-{c}=<<{a + b}-{c}={a + b - c}>>{a + b - c} {item}."]
    return q, s, a + b - c


def twice_as_many(r):
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, k = r.randint(3, 50), r.choice([2, 3, 4])
    word = {2: "twice", 3: "three times", 4: "four times"}[k]
    q = (f"{name} sold {a} {item} in April, and then {pronoun(name)} sold {word} as many {item} in May. "
         f"How many {item} did {name} sell altogether in April and May?")
    s = [f"{name} sold {a}*{k}=<<{a}*{k}={a * k}>>{a * k} {item} in May.",
         f"{name} sold {a}+{a * k}=<<{a}+{a * k}={a + a * k}>>{a + a * k} {item} altogether in April and May."]
    return q, s, a + a * k


def hourly_pay(r):
    name = r.choice(NAMES)
    rate, hours, weeks = r.randint(8, 30), r.randint(3, 20), r.randint(2, 6)
    q = (f"{name} earns ${rate} an hour babysitting. This week {pronoun(name)} babysat for {hours} hours. "
         f"If {pronoun(name)} works the same hours for {weeks} weeks, how much does {pronoun(name)} earn?")
    s = [f"In one week {name} earns {rate}*{hours}=$<<{rate}*{hours}={rate * hours}>>{rate * hours}.",
         f"In {weeks} weeks {pronoun(name)} earns {rate * hours}*{weeks}=$<<{rate * hours}*{weeks}="
         f"{rate * hours * weeks}>>{rate * hours * weeks}."]
    return q, s, rate * hours * weeks


def pages_left(r):
    name = r.choice(NAMES)
    per_day, days = r.randint(5, 30), r.randint(2, 9)
    total = per_day * days + r.randint(1, 200)
    q = (f"{name} is reading a {total}-page book. {pronoun(name).capitalize()} reads {per_day} pages every day. "
         f"How many pages are left after {days} days?")
    s = [f"In {days} days {name} reads {per_day}*{days}=<<{per_day}*{days}={per_day * days}>>{per_day * days} pages.",
         f"There are {total}-{per_day * days}=<<{total}-{per_day * days}={total - per_day * days}>>"
         f"{total - per_day * days} pages left."]
    return q, s, total - per_day * days


def boxes(r):
    name, item = r.choice(NAMES), r.choice(ITEMS)
    per_box, n_boxes = r.randint(4, 24), r.randint(2, 12)
    used = r.randint(1, per_box * n_boxes - 1)
    q = (f"A box holds {per_box} {item}. {name} fills {n_boxes} boxes and then uses {used} of the {item}. "
         f"How many {item} are still in the boxes?")
    s = [f"The boxes hold {per_box}*{n_boxes}=<<{per_box}*{n_boxes}={per_box * n_boxes}>>{per_box * n_boxes} {item}.",
         f"{per_box * n_boxes}-{used}=<<{per_box * n_boxes}-{used}={per_box * n_boxes - used}>>"
         f"{per_box * n_boxes - used} {item} are still in the boxes."]
    return q, s, per_box * n_boxes - used


def discount(r):
    name = r.choice(NAMES)
    price, off, n = r.choice(range(20, 401, 20)), r.choice([10, 20, 25, 50]), r.randint(2, 5)
    cut = price * off // 100
    q = (f"A jacket costs ${price}. The store gives {off}% off. {name} buys {n} jackets. "
         f"How much does {pronoun(name)} pay?")
    s = [f"The discount is {price}*{off}/100=$<<{price}*{off}/100={cut}>>{cut} per jacket.",
         f"One jacket costs {price}-{cut}=$<<{price}-{cut}={price - cut}>>{price - cut}.",
         f"{n} jackets cost {price - cut}*{n}=$<<{price - cut}*{n}={(price - cut) * n}>>{(price - cut) * n}."]
    return q, s, (price - cut) * n


KINDS = [buy_and_give, twice_as_many, hourly_pay, pages_left, boxes, discount]


def rows(split, n, r):
    for i in range(n):
        question, steps, answer = r.choice(KINDS)(r)
        yield {"data_source": "gsm8k-style",
               "prompt": [{"role": "user", "content": question + INSTRUCTION}],
               "ability": "math",
               "reward_model": {"style": "rule", "ground_truth": str(answer)},
               "extra_info": {"split": split, "index": i, "question": question,
                              "answer": "\n".join(steps) + f"\n#### {answer}"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for train.jsonl and test.jsonl")
    parser.add_argument("--train", type=int, default=200)
    parser.add_argument("--test", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    r = random.Random(args.seed)
    for split, n in (("train", args.train), ("test", args.test)):
        with open(os.path.join(args.out, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows(split, n, r):
                f.write(json.dumps(row) + "\n")
    print(f"wrote {args.train} train and {args.test} test rows to {args.out}")


if __name__ == "__main__":
    main()
