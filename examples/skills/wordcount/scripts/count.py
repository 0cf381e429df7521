"""Count words in the files given; write the most frequent to $OUTPUT_DIR/wordcount.csv."""

import collections
import os
import re
import sys

args = sys.argv[1:]
top = 10
if "--top" in args:
    i = args.index("--top")
    top = int(args[i + 1])
    del args[i : i + 2]
counts: collections.Counter[str] = collections.Counter()
for name in args:
    with open(name, encoding="utf-8") as f:
        counts.update(re.findall(r"[a-z']+", f.read().lower()))
with open(os.path.join(os.environ["OUTPUT_DIR"], "wordcount.csv"), "w") as out:
    out.write("word,count\n")
    for word, n in counts.most_common(top):
        out.write(f"{word},{n}\n")
print(f"{sum(counts.values())} words, {len(counts)} distinct")
