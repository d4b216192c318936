#!/usr/bin/env bash
# Rebuilds data/tokenizer/tiny_spm.model, the small SentencePiece model used by tests and the example, from
# data/tokenizer/corpus.txt. Ids follow the Gemma convention of openpi's tokenizer: pad=0, eos=1, bos=2, unk=3.
# byte_fallback makes any text encodable (e.g. "\n" -> <0x0A>); identity normalization and no dummy prefix keep
# the input bytes as given, like the PaliGemma tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
spm_train \
  --input=data/tokenizer/corpus.txt \
  --model_prefix=data/tokenizer/tiny_spm \
  --model_type=bpe \
  --vocab_size=1000 \
  --hard_vocab_limit=false \
  --character_coverage=1.0 \
  --byte_fallback=true \
  --normalization_rule_name=identity \
  --add_dummy_prefix=false \
  --remove_extra_whitespaces=false \
  --split_digits=true \
  --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 \
  --seed_sentencepiece_size=10000 \
  --num_threads=1 \
  --minloglevel=1
rm -f data/tokenizer/tiny_spm.vocab
ls -l data/tokenizer/tiny_spm.model
