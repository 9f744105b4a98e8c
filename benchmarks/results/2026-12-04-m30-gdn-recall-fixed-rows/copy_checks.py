"""Can a trained reference copy, and does it in the needle template? (session 27; CPU, a minute a model)

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/results/2026-12-04-m30-gdn-recall-fixed-rows/copy_checks.py \
        plans/reference/gdn-hybrid-11m-sharegpt plans/reference/gdn-hybrid-30m-sharegpt .dev/train/m30r/u126f/gdn

1. Repeats: 8 sequences of 100 random tokens (ids 300-7999) or random digit tokens, each followed by itself;
   teacher-forced greedy accuracy on the second copy (an induction head copies it; chance ~0 / 0.1).
2. A number stated once and asked for again, 110 tokens later: in the training rows' needle template ("The pass
   key for russet-jackal is 68564. Remember it." ... "Answer: The pass key for russet-jackal is") and in other
   words ("My locker code at the gym is 68564 ..." ... "my locker code at the gym is"); the probability the model
   gives each right digit of " 68564", teacher-forced.
"""
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

FILL = (" The shop on the corner sold bread, milk and old newspapers. The wind moved slowly over the fields near "
        "the town. A small boat was tied to the post by the river.")
PROMPTS = {
    "needle template": FILL + " The pass key for russet-jackal is 68564. Remember it." + FILL * 2
    + "\nQuestion: What is the pass key for russet-jackal?\nAnswer: The pass key for russet-jackal is 68564",
    "other words": FILL + " My locker code at the gym is 68564 and I never forget it." + FILL * 2
    + " So, to repeat: my locker code at the gym is 68564",
}


def main(paths):
    print("| model | repeat: random tokens | repeat: random digits | needle template: p(6, 8, 5, 6, 4) "
          "| other words: p(6, 8, 5, 6, 4) |\n|---|---|---|---|---|")
    for path in paths:
        tok = Tokenizer.from_file(f"{path}/tokenizer.json")
        digits = torch.tensor([tok.token_to_id(str(d)) for d in range(10)])
        m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(1)
        cells = []
        for x in (torch.randint(300, 8000, (8, 100), generator=g), digits[torch.randint(0, 10, (8, 100), generator=g)]):
            ids = torch.cat([x, x], 1)
            with torch.no_grad():
                pred = m(input_ids=ids).logits.argmax(-1)
            cells.append(f"{(pred[:, 100:-1] == ids[:, 101:]).float().mean():.2f}")
        for text in PROMPTS.values():
            ids = tok.encode(text).ids
            with torch.no_grad():
                p = torch.softmax(m(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            n = len(ids)
            cells.append(", ".join(f"{float(p[t - 1, ids[t]]):.2f}" for t in range(n - 5, n)))
        print(f"| {path} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
