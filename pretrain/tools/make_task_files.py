"""Small task files in the official layouts, for trying the tagging and QA commands offline (`make demo-ner`,
`make demo-qa`, the tests).

  python -m pretrain.tools.make_task_files --kind=ner --output=DIR [--train=2000 --dev=300 --test=300 --seed=0]
  python -m pretrain.tools.make_task_files --kind=squad --output=DIR [--train=2000 --dev=300]
  python -m pretrain.tools.make_task_files --kind=squad_v2 --output=DIR

ner: DIR/train.txt, valid.txt and test.txt in CoNLL-2003's layout (`word POS chunk NER`, `-DOCSTART-` lines,
a blank line between sentences), from templates with PER, ORG, LOC and MISC slots, single and multi-word.
squad: DIR/train-v1.1.json and dev-v1.1.json: paragraphs of such sentences, and questions whose answer is one
slot of one sentence ("Where did X go?"). squad_v2: DIR/train-v2.0.json and dev-v2.0.json, where a third of the
questions ask about a person the paragraph never names (no answer). The names are invented words, and those of the dev and test files
never occur in the train file, so a model must read the context rather than remember names.
"""
from __future__ import annotations

import argparse
import json
import os
import random

# word POS pairs around the slots; a slot is {TYPE}
TEMPLATES = (
    "{PER} visited {LOC} last week .",
    "{ORG} hired {PER} in {LOC} .",
    "Shares of {ORG} fell in {LOC} on Monday .",
    "The {MISC} festival in {LOC} drew large crowds .",
    "{PER} said {ORG} would open an office in {LOC} .",
    "{PER} , a {MISC} writer , was born in {LOC} .",
    "Police in {LOC} arrested {PER} on Friday .",
    "{ORG} and {ORG} agreed to merge , {PER} said .",
    "the meeting ended without a deal .",
    "{PER} won the {MISC} open after beating {PER} .",
)
SUFFIXES = {"ORG": ("Corp", "Group", "Bank", "United"), "LOC": ("City", "Valley", "Bay"), "PER": (), "MISC": ()}
SYLLABLES = ("ka", "lo", "mi", "ran", "tes", "vor", "bel", "du", "shi", "nor", "pel", "zan", "gri", "fo", "ten")
POS = {".": ".", ",": ",", "the": "DT", "The": "DT", "a": "DT", "an": "DT", "in": "IN", "of": "IN", "on": "IN",
       "after": "IN", "without": "IN", "and": "CC", "to": "TO"}


def invented_names(rng: random.Random, count: int) -> list[str]:
    """Distinct capitalised non-words of 2-3 syllables."""
    names = set()
    while len(names) < count:
        names.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize())
    return sorted(names)


def entity(rng: random.Random, kind: str, names: list[str]) -> list[str]:
    """One entity's words: a name, sometimes two (PER) or with a type word (ORG Corp, LOC Bay)."""
    words = [rng.choice(names)]
    if kind == "PER" and rng.random() < 0.5:
        words.append(rng.choice(names))
    if SUFFIXES[kind] and rng.random() < 0.4:
        words.append(rng.choice(SUFFIXES[kind]))
    return words


def sentence(rng: random.Random, names: list[str]) -> list[tuple[str, str, str, str]]:
    """(word, POS, chunk, NER) rows of one templated sentence."""
    rows = []
    for token in rng.choice(TEMPLATES).split():
        if token.startswith("{"):
            kind = token[1:-1]
            for i, word in enumerate(entity(rng, kind, names)):
                rows.append((word, "NNP", ("B-" if i == 0 else "I-") + "NP", ("B-" if i == 0 else "I-") + kind))
        else:
            rows.append((token, POS.get(token, "NN"), "O", "O"))
    return rows


def write_split(path: str, rng: random.Random, names: list[str], count: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("-DOCSTART- -X- -X- O\n\n")
        for _ in range(count):
            f.writelines(" ".join(row) + "\n" for row in sentence(rng, names))
            f.write("\n")
    print(f"{path}: {count} sentences")


# QA: (a sentence with the answer slot {A} and a person {B}, the question, the answer's entity type)
FACTS = (("{B} visited {A} last week .", "Where did {B} go last week ?", "LOC"),
         ("{A} hired {B} .", "Which company hired {B} ?", "ORG"),
         ("{B} was born in {A} .", "Where was {B} born ?", "LOC"),
         ("{B} works for {A} .", "Which company does {B} work for ?", "ORG"),
         ("{A} beat {B} in the final .", "Who beat {B} in the final ?", "PER"))


def paragraph(rng: random.Random, names: list[str], unanswerable: float = 0.0) -> dict:
    """One SQuAD paragraph: three facts about different people, one question per fact; with probability
    `unanswerable` a question asks about someone else, and has no answer (v2.0)."""
    context, qas = "", []
    for template, question, kind in rng.sample(FACTS, 3):
        answer, subject = " ".join(entity(rng, kind, names)), rng.choice(names)
        sentence = template.replace("{B}", subject)
        start = len(context) + sentence.index("{A}")
        context += sentence.replace("{A}", answer).replace(" .", ".") + " "
        asked = subject  # v1.1 draws nothing more, so its files stay as they were
        if unanswerable and rng.random() < unanswerable:
            asked = rng.choice([n for n in names if n != subject])
        answers = [{"text": answer, "answer_start": start}] if asked == subject else []
        qas.append({"id": f"q{rng.getrandbits(48):012x}", "question": question.replace("{B}", asked).replace(" ?", "?"),
                    "answers": answers, **({} if answers else {"is_impossible": True})})
    return {"context": context.strip(), "qas": qas}


def write_squad(path: str, rng: random.Random, names: list[str], count: int, unanswerable: float = 0.0) -> None:
    paragraphs = [paragraph(rng, names, unanswerable) for _ in range(-(-count // 3))]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "2.0" if unanswerable else "1.1",
                   "data": [{"title": "generated", "paragraphs": paragraphs}]}, f, indent=1)
    print(f"{path}: {3 * len(paragraphs)} questions")


def write_files(kind: str, output: str, train: int, dev: int, test: int = 0, seed: int = 0) -> None:
    """The files of `kind` (ner | squad | squad_v2) with these many sentences / questions per split."""
    rng = random.Random(seed)
    names = invented_names(rng, 600)
    rng.shuffle(names)
    held_out = names[:200]  # dev and test names: never in train
    os.makedirs(output, exist_ok=True)
    if kind.startswith("squad"):
        version, unanswerable = ("2.0", 1 / 3) if kind == "squad_v2" else ("1.1", 0.0)
        write_squad(os.path.join(output, f"train-v{version}.json"), rng, names[200:], train, unanswerable)
        write_squad(os.path.join(output, f"dev-v{version}.json"), rng, held_out, dev, unanswerable)
        return
    write_split(os.path.join(output, "train.txt"), rng, names[200:], train)
    write_split(os.path.join(output, "valid.txt"), rng, held_out[:100], dev)
    write_split(os.path.join(output, "test.txt"), rng, held_out[100:], test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=("ner", "squad", "squad_v2"), default="ner")
    parser.add_argument("--output", required=True)
    parser.add_argument("--train", type=int, default=2000, help="sentences (ner) or questions (squad) in train")
    parser.add_argument("--dev", type=int, default=300, help="in valid.txt / dev-v*.json")
    parser.add_argument("--test", type=int, default=300, help="sentences in test.txt (ner)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_files(args.kind, args.output, args.train, args.dev, args.test, args.seed)


if __name__ == "__main__":
    main()
