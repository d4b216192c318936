#!/usr/bin/env python3
"""Writes tests/data/tokenizer/tiny_spm_fast.model: data/tokenizer/tiny_spm.model with 256 + 128 atomic pieces
appended, so that openpi's map of FAST ids into the SentencePiece vocabulary (pg(id) = vocab - 1 - 128 - id) lands
on pieces that re-encode to themselves, as the user-defined tail tokens of PaliGemma's tokenizer do.

Why: pi0-FAST's actions come back through a text round trip (decode the generated ids, cut the text between
"Action: " and "|", encode it again, map back). Over tiny_spm.model, pg() lands on ordinary word pieces, which
re-encode into other merges, so even a model that generates the trained ids exactly decodes no actions. The
end-to-end pi0-FAST test (tests/integration/test_pi0_fast_train.cpp) needs the round trip to be exact.

Appended, in id order: <fast000> .. <fast255> (ids 793..1048), then <seg000> .. <seg127> (the 128 reserved tail
tokens pg() skips), all USER_DEFINED (matched whole by the encoder). Run with sentencepiece 0.2.0 and protobuf:
    python3 -m venv /tmp/spm_venv && /tmp/spm_venv/bin/pip install sentencepiece==0.2.0 protobuf
    /tmp/spm_venv/bin/python tests/data/make_fast_spm.py
A rerun writes the same bytes.
"""
import os

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "data", "tokenizer", "tiny_spm.model")
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "tiny_spm_fast.model")
FAST_VOCAB = 256  # the FAST tokenizers of tests/data/golden/fast (tokenizer_a) have 256 ids
RESERVED = 128

proto = model_pb2.ModelProto()
with open(SRC, "rb") as f:
    proto.ParseFromString(f.read())
base = len(proto.pieces)
for name in [f"<fast{i:03d}>" for i in range(FAST_VOCAB)] + [f"<seg{i:03d}>" for i in range(RESERVED)]:
    piece = proto.pieces.add()
    piece.piece = name
    piece.score = 0.0
    piece.type = model_pb2.ModelProto.SentencePiece.USER_DEFINED
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "wb") as f:
    f.write(proto.SerializeToString())

# Self-checks: pg(id) of every FAST id is an appended piece, and decode -> encode gives it back alone and in a row.
sp = spm.SentencePieceProcessor(model_file=OUT)
vocab = sp.get_piece_size()
assert vocab == base + FAST_VOCAB + RESERVED, vocab
pg = [vocab - 1 - RESERVED - i for i in range(FAST_VOCAB)]
assert all(sp.id_to_piece(p).startswith("<fast") for p in pg)
row = [pg[i] for i in (0, 5, 5, 255, 17, 128)]
assert sp.encode(sp.decode(row)) == row, (row, sp.encode(sp.decode(row)))
text = "Action: " + sp.decode(row) + "|"
assert sp.encode(text)[-len(row) - 1:-1] == row
print(f"wrote {OUT}: {base} + {FAST_VOCAB} + {RESERVED} = {vocab} pieces")
