#!/usr/bin/env bash
# A real summarization corpus that any Debian machine can fetch: the package descriptions in the
# Translation-en lists (text = the long description, headline = its one-line synopsis), in the
# WikiHow CSV layout the FSDP tutorial reads, and a SentencePiece model with T5's ids trained on
# the training texts. input/t5_summarize.yaml trains on it.
#
# usage: bash jobs/make-summaries.sh DIR
# Writes, skipping each step whose output is already there (delete a file to redo its step):
#   DIR/lists/         apt's Translation-en lists, fetched by `apt-get update` with its own state
#                      and cache folders (the system's lists and cache are not touched) and no
#                      Packages indices; the system's apt sources, so a mirror it uses is used
#   DIR/train.csv      columns text, headline, title (= the package name); RFC 4180, all quoted
#   DIR/val.csv        the held-out packages, about 5%
#   DIR/sft_train.jsonl, DIR/sft_val.jsonl
#                      the same rows as prompt/response pairs for supervised fine-tuning of a
#                      causal LM (input/llama_sft.yaml): {"prompt": "Package: NAME\nSummary:
#                      SYNOPSIS\nDescription:\n", "response": TEXT}, one JSON object a line
#   DIR/spiece.model   spm_train unigram, 8000 pieces; pad 0, eos 1, unk 2, no bos (T5's ids)
# Rows: Description-en's first line is the headline; the rest, with " ." lines as paragraph
# breaks (written "\n") and the other lines joined by spaces, is the text. Dropped: a package seen
# before (the first list read wins), a text seen before (many packages share one: the first in
# package-name order stays), texts under MIN_WORDS words, headlines under 2 words.
# Split: a package goes to val.csv when (h mod 100) < 5, h the polynomial hash (h*31 + byte) mod
# 1000000007 over the bytes of its name stem (the name less a "lib" prefix and trailing -dev,
# -doc, -data, -common, -bin, -utils, -tools, -dbg, -examples and soname digits), so that a
# family such as libfoo2, libfoo-dev and foo-doc lands on one side. Deterministic.
# spm_train gives the same pieces, ids and scores run to run (the .model file also records the
# paths it was trained from, so its bytes differ between folders).
# Measured here (2 cores shared with other work, Debian 12): 66 s from nothing (apt-get update
# 5 s for 6.6 MB, the CSV files 4 s, spm_train the rest; spm_train alone took 50-117 s over
# runs as the load varied); 570 MB peak memory (spm_train).
# Needs apt-get, /usr/lib/apt/apt-helper and spm_train (Debian's sentencepiece). Without the
# network or the apt sources it stops with one line saying so, exit 1.
set -euo pipefail

MIN_WORDS=${MIN_WORDS:-12}
VOCAB=${VOCAB:-8000}
[ $# -eq 1 ] || { echo "usage: bash jobs/make-summaries.sh DIR" >&2; exit 2; }
DIR=$1
fail() { echo "make-summaries.sh: $*" >&2; exit 1; }
command -v apt-get >/dev/null || fail "no apt-get: this needs a Debian machine"
[ -x /usr/lib/apt/apt-helper ] || fail "no /usr/lib/apt/apt-helper (package apt)"
command -v spm_train >/dev/null || fail "no spm_train (apt-get install sentencepiece)"
mkdir -p "$DIR" || fail "cannot create $DIR"
DIR=$(cd "$DIR" && pwd)
start_s=$(date +%s)

# 1. The lists. Acquire::Languages=en brings Translation-en (Debian images often turn languages
# off); Dir::Etc::Parts points at an empty folder so the system's apt.conf.d snippets (update
# hooks, "no languages") do not apply; downloads run as the current user.
lists=("$DIR"/lists/*_i18n_Translation-en*)
if [ ! -e "${lists[0]}" ]; then
  mkdir -p "$DIR/lists/partial" "$DIR/cache/archives/partial" "$DIR/apt.conf.d"
  echo "fetching Translation-en into $DIR/lists (apt-get update, log $DIR/apt-update.log)"
  apt-get update -o Dir::State::Lists="$DIR/lists" -o Dir::Cache="$DIR/cache" \
    -o Dir::Etc::Parts="$DIR/apt.conf.d" -o Acquire::Languages=en \
    -o Acquire::IndexTargets::deb::Packages::DefaultEnabled=false \
    -o APT::Sandbox::User="$(id -un)" >"$DIR/apt-update.log" 2>&1 || true
  lists=("$DIR"/lists/*_i18n_Translation-en*)
  [ -e "${lists[0]}" ] ||
    fail "apt-get update fetched no Translation-en list (no network, or no reachable apt source?):" \
      "$(grep -E '^(E|W):' "$DIR/apt-update.log" | head -n1 | tr -s ' ' | cut -c1-200) (log $DIR/apt-update.log)"
fi
echo "lists: $(ls "$DIR"/lists/*_i18n_Translation-en* | wc -l) Translation-en files," \
  "$(du -ch "$DIR"/lists/*_i18n_Translation-en* | tail -n1 | cut -f1) compressed"

# 2. The CSV files. The shortest list name first: the release's main list before its -updates
# and -security lists, so that the release's packages come first and in name order.
if [ ! -f "$DIR/train.csv" ] || [ ! -f "$DIR/val.csv" ] || [ ! -f "$DIR/counts.txt" ] ||
  [ ! -f "$DIR/sft_train.jsonl" ] || [ ! -f "$DIR/sft_val.jsonl" ]; then
  for l in "$DIR"/lists/*_i18n_Translation-en*; do echo "${#l} $l"; done | sort -n | cut -d' ' -f2- |
    while IFS= read -r f; do
      /usr/lib/apt/apt-helper cat-file "$f" || fail "cannot read $f"
      echo
    done | LC_ALL=C awk -v min_words="$MIN_WORDS" -v train="$DIR/train.csv.tmp" -v val="$DIR/val.csv.tmp" \
    -v spm_text="$DIR/spm_input.txt.tmp" -v counts="$DIR/counts.txt.tmp" \
    -v sft_train="$DIR/sft_train.jsonl.tmp" -v sft_val="$DIR/sft_val.jsonl.tmp" '
    BEGIN {
      for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i
      print "\"text\",\"headline\",\"title\"" > train
      print "\"text\",\"headline\",\"title\"" > val
    }
    function quote(s) { gsub(/"/, "\"\"", s); return "\"" s "\"" }
    # A JSON string: backslash, quote, line break and tab escaped, other control bytes dropped
    # (a loop, not gsub: mawk and gawk read backslashes in a replacement differently).
    function jstr(s,    out, i, c) {
      out = ""
      while ((i = match(s, /[\\"\001-\037]/)) > 0) {
        c = substr(s, i, 1)
        out = out substr(s, 1, i - 1) (c == "\\" ? "\\\\" : c == "\"" ? "\\\"" : c == "\n" ? "\\n" : c == "\t" ? "\\t" : "")
        s = substr(s, i + 1)
      }
      return "\"" out s "\""
    }
    function stem(name) {
      sub(/^lib/, "", name)
      while (sub(/-(dev|doc|data|common|bin|utils|tools|dbg|examples)$/, "", name)) {}
      sub(/[0-9.]+$/, "", name)
      return name
    }
    function held_out(name,    h, i) {
      h = 0
      for (i = 1; i <= length(name); i++) h = (h * 31 + ord[substr(name, i, 1)]) % 1000000007
      return h % 100 < 5
    }
    function emit(    words, out) {
      if (pkg == "" || synopsis == "" || (pkg in seen_pkg)) return
      seen_pkg[pkg] = 1
      if (para != "") text = text (text == "" ? "" : "\n") para
      if (split(text, words, /[ \n]+/) < min_words || split(synopsis, words, / +/) < 2) { ++short; return }
      if (text in seen_text) { ++dup; return }
      seen_text[text] = 1
      out = held_out(stem(pkg)) ? val : train
      print quote(text) "," quote(synopsis) "," quote(pkg) > out
      print "{\"prompt\": " jstr("Package: " pkg "\nSummary: " synopsis "\nDescription:\n") ", \"response\": " \
        jstr(text) "}" > (out == train ? sft_train : sft_val)
      if (out == train) {  # spm_train reads one sentence a line: the paragraphs, and the headline
        print text > spm_text
        print synopsis > spm_text
      }
      ++rows[out]
    }
    function reset() { pkg = ""; synopsis = ""; text = ""; para = ""; in_desc = 0 }
    BEGIN { reset() }
    /^$/ { emit(); reset(); next }
    /^Package: / { pkg = substr($0, 10); next }
    /^Description-en: / { synopsis = substr($0, 17); sub(/[ \t]+$/, "", synopsis); in_desc = 1; next }
    /^ / && in_desc {
      line = substr($0, 2)
      if (line == ".") { if (para != "") text = text (text == "" ? "" : "\n") para; para = ""; next }
      sub(/^[ \t]+/, "", line); sub(/[ \t]+$/, "", line)
      if (line != "") para = para (para == "" ? "" : " ") line
      next
    }
    /^[^ ]/ { in_desc = 0 }
    END {
      emit()
      printf "%d %d %d %d\n", rows[train], rows[val], short, dup > counts
    }' || fail "parsing the Translation-en lists failed"
  mv "$DIR/sft_train.jsonl.tmp" "$DIR/sft_train.jsonl"
  mv "$DIR/sft_val.jsonl.tmp" "$DIR/sft_val.jsonl"
  mv "$DIR/counts.txt.tmp" "$DIR/counts.txt"
  mv "$DIR/spm_input.txt.tmp" "$DIR/spm_input.txt"
  mv "$DIR/val.csv.tmp" "$DIR/val.csv"
  mv "$DIR/train.csv.tmp" "$DIR/train.csv"
  rm -f "$DIR/spiece.model" "$DIR/spiece.vocab"  # trained on the old rows
fi
read -r train_rows val_rows short_rows dup_rows <"$DIR/counts.txt" || fail "no $DIR/counts.txt (delete train.csv to redo)"
echo "train.csv: $train_rows rows, $(du -h "$DIR/train.csv" | cut -f1); val.csv: $val_rows rows," \
  "$(du -h "$DIR/val.csv" | cut -f1); dropped $short_rows short and $dup_rows duplicate descriptions"

# 3. The SentencePiece model, T5's ids, on the training texts and headlines.
if [ ! -f "$DIR/spiece.model" ]; then
  echo "training $DIR/spiece.model (spm_train, $VOCAB pieces, log $DIR/spm_train.log)"
  spm_train --input="$DIR/spm_input.txt" --model_prefix="$DIR/spiece.tmp" --vocab_size="$VOCAB" \
    --model_type=unigram --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1 \
    --num_threads="$(nproc)" >"$DIR/spm_train.log" 2>&1 || fail "spm_train failed (log $DIR/spm_train.log)"
  mv "$DIR/spiece.tmp.vocab" "$DIR/spiece.vocab"
  mv "$DIR/spiece.tmp.model" "$DIR/spiece.model"
fi
echo "spiece.model: $(wc -l <"$DIR/spiece.vocab") pieces, $(du -h "$DIR/spiece.model" | cut -f1)"
echo "done in $(($(date +%s) - start_s)) s"
