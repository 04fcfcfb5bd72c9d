#!/usr/bin/env bash
# SentencePiece models from the command line. Usage: sentencepiece_models.sh <meshtensor> <case>
#   spm     models spm_train makes of the fortunes (BPE with byte fallback; nmt_nfkc by default,
#           and identity without whitespace removal as Llama's) encode as spm_encode does, line
#           by line, and as the python sentencepiece module does on whole texts; the
#           from-sentencepiece tokenizer.json reads back as the model; the identity model's
#           Hugging Face form, computed by meshtensor's own BPE, encodes the same; decoding is
#           sentencepiece's; files that are not BPE models exit 2 naming the problem
#   models  a Llama trained on each kind of tokenizer (a .model, its tokenizer.json, the identity
#           model's Hugging Face form, byte-level BPE) generates the same tokens from its
#           checkpoint and from its Hugging Face export read back
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
command -v spm_train >/dev/null || { echo "SKIPPED: spm_train is not installed"; exit 77; }

fortunes=/usr/share/games/fortunes/fortunes
spm_train --input="$fortunes" --model_prefix="$dir/nfkc" --vocab_size=1000 --model_type=bpe \
  --byte_fallback=true --minloglevel=2 >/dev/null 2>&1
spm_train --input="$fortunes" --model_prefix="$dir/identity" --vocab_size=1000 --model_type=bpe \
  --byte_fallback=true --normalization_rule_name=identity --remove_extra_whitespaces=false \
  --minloglevel=2 >/dev/null 2>&1
"$bin" tokenizer from-sentencepiece --model "$dir/nfkc.model" --out "$dir/nfkc.json" >/dev/null
"$bin" tokenizer from-sentencepiece --model "$dir/identity.model" --out "$dir/identity_hf.json" \
  --hugging-face >/dev/null

case $case_name in
spm)
  /usr/bin/python3 - "$dir" <<'PY'
import pathlib, sys
out = pathlib.Path(sys.argv[1])
lines = ["Hello world, it's a test!  Ünïcödé e\u0301 a\u0308\u0301 中文字符 日本語のテキスト 🙂👍🏽",
         "   leading spaces,   runs   inside and trailing   ", "tabs\tand\u00a0odd\u3000spaces ① ﬁ ＡＢＣ",
         "def f(x): return {'a': [1, 2]}  # ∑ ∫ → ≠ 12345678 3.14159",
         "supercalifragilistic" * 30, "<s> is text here </s> <unk>"]
(out / "lines.txt").write_text("\n".join(lines) + "\n")
(out / "bad.txt").write_bytes(b"ok \xff\xfe bad \xc3( \xe2\x82 end \xf0\x9f\x99")
PY
  for model in nfkc identity; do
    for tokenizer in "$dir/$model.model" "$dir/nfkc.json" "$dir/identity_hf.json"; do
      case $tokenizer in *"$model"*) ;; *) continue ;; esac
      while IFS= read -r line; do
        # Hugging Face's form matches control pieces in text as special tokens; sentencepiece
        # reads them as text.
        [ "$tokenizer" = "$dir/identity_hf.json" ] && [[ $line == *"<s>"* ]] && continue
        ours=$(printf '%s' "$line" | "$bin" tokenizer encode --tokenizer "$tokenizer")
        theirs=$(printf '%s\n' "$line" | spm_encode --model="$dir/$model.model" --output_format=id)
        [ "$ours" = "$theirs" ] ||
          fail "$(basename "$tokenizer") on '$line': ours $ours, spm_encode $theirs"
      done <"$dir/lines.txt"
      # sentencepiece writes U+FFFD for each invalid byte; a tokenizer.json's text takes one for
      # each maximal invalid sequence, as Hugging Face's implementations do.
      ours=$("$bin" tokenizer encode --tokenizer "$tokenizer" <"$dir/bad.txt")
      theirs=$(spm_encode --model="$dir/$model.model" --output_format=id <"$dir/bad.txt")
      [ "$tokenizer" = "$dir/identity_hf.json" ] || [ "$ours" = "$theirs" ] ||
        fail "$(basename "$tokenizer") on bytes that are not UTF-8: ours $ours, spm_encode $theirs"
      ours=$("$bin" tokenizer encode --tokenizer "$tokenizer" --json <"$fortunes")
      theirs=$(/usr/bin/python3 -c 'import json, sys, sentencepiece as s
print(json.dumps(s.SentencePieceProcessor(model_file=sys.argv[1]).encode(open(sys.argv[2]).read()), separators=(",", ":")))' \
        "$dir/$model.model" "$fortunes")
      [ "$ours" = "$theirs" ] || fail "$(basename "$tokenizer") on the fortunes: ours ${ours:0:200}, sentencepiece ${theirs:0:200}"
      decoded=$("$bin" tokenizer decode --tokenizer "$tokenizer" <<<"$ours" | md5sum)
      expected=$(/usr/bin/python3 -c 'import sys, sentencepiece as s
p = s.SentencePieceProcessor(model_file=sys.argv[1]); sys.stdout.write(p.decode(p.encode(open(sys.argv[2]).read())))' \
        "$dir/$model.model" "$fortunes" | md5sum)
      same "$expected" "$decoded" "$(basename "$tokenizer"): decoding the fortunes' ids as sentencepiece does"
      echo "ok: $(basename "$tokenizer") encodes $(wc -l <"$dir/lines.txt") lines and invalid bytes as spm_encode, the fortunes as sentencepiece"
    done
  done
  printf 'not a model at all' >"$dir/text.model"
  expect 2 "text.model is not a SentencePiece model protobuf" \
    "$bin" tokenizer encode --tokenizer "$dir/text.model" </dev/null
  head -c 1000 "$dir/nfkc.model" >"$dir/cut.model"
  expect 2 "cut.model is not a SentencePiece model protobuf: a field of .* runs past the end" \
    "$bin" tokenizer encode --tokenizer "$dir/cut.model" </dev/null
  spm_train --input="$fortunes" --model_prefix="$dir/unigram" --vocab_size=500 --minloglevel=2 >/dev/null 2>&1
  expect 2 "a SentencePiece unigram model; meshtensor reads BPE models" \
    "$bin" tokenizer encode --tokenizer "$dir/unigram.model" </dev/null
  /usr/bin/python3 - "$dir" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
doc = json.loads((out / "nfkc.json").read_text())
doc["model"]["vocab"]["▁extra"] = 1000
(out / "differs.json").write_text(json.dumps(doc))
doc = json.loads((out / "nfkc.json").read_text())
doc["sentencepiece_model"] = "not*base64"
(out / "b64.json").write_text(json.dumps(doc))
PY
  expect 2 "its vocabulary and its sentencepiece_model differ at id 1000" \
    "$bin" tokenizer encode --tokenizer "$dir/differs.json" </dev/null
  expect 2 "sentencepiece_model: character 3 is not base64" \
    "$bin" tokenizer encode --tokenizer "$dir/b64.json" </dev/null
  expect 2 "--out .*nfkc.model is the file of --model" \
    "$bin" tokenizer from-sentencepiece --model "$dir/nfkc.model" --out "$dir/nfkc.model"
  ;;
models)
  "$bin" tokenizer train --vocab 512 --out "$dir/bytes.json" >/dev/null
  llama=llama:layers=2,heads=2,dim=32,context=32
  for tokenizer in nfkc.model nfkc.json identity_hf.json bytes.json; do
    ck=$dir/ck_${tokenizer%.*}_${tokenizer##*.}
    "$bin" train --tokenizer "$dir/$tokenizer" --model "$llama" --mode exact --batch 12 --seed 4 \
      --steps 3 --ranks 1 --save "$ck" >/dev/null
    generate=(generate --mode exact --prompt "Where there is a will" --max-new-tokens 12
      --temperature 0.9 --seed 3 --json)
    one=$("$bin" "${generate[@]}" --checkpoint "$ck")
    "$bin" checkpoint export --format hf "$ck" "$ck.hf" >/dev/null
    two=$("$bin" "${generate[@]}" --checkpoint "hf:$ck.hf")
    same "$one" "$two" "$tokenizer: the export generates the checkpoint's tokens"
  done
  [ -s "$dir/ck_nfkc_model.hf/tokenizer.model" ] || fail "the export of a .model tokenizer has no tokenizer.model"
  /usr/bin/python3 - "$dir/ck_nfkc_model.hf/tokenizer.json" <<'PY' || fail "the exported tokenizer.json is not Hugging Face's form"
import json, sys
doc = json.load(open(sys.argv[1]))
assert "sentencepiece_model" not in doc and doc["model"]["byte_fallback"] is True
assert doc["normalizer"]["normalizers"][0]["type"] == "Precompiled"
PY
  echo "ok: a .model tokenizer exports as tokenizer.model and Hugging Face's tokenizer.json"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
