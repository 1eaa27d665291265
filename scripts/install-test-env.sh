#!/usr/bin/env bash
# Build a virtual environment with Chorus, its test tools and the reference oracle
# (chatterbox-tts 0.1.7 on the CPU, used only by parity tests; see docs/testing.md). It prints
# each step; pip's own output goes to VENV/install.log (its end is shown if a step fails).
# The oracle pins older numpy, huggingface_hub, safetensors and tokenizers, so this environment
# is kept apart from the product's (.venv, made by scripts/serve.sh and scripts/demo.sh through
# scripts/install-product-env.sh): never point it there.
#
#   bash scripts/install-test-env.sh [VENV_DIR]     (default: .venv-test)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${1:-.venv-test}
if [[ "$VENV" == ".venv" || "$VENV" == "./.venv" ]]; then
  echo "install-test-env.sh: .venv is the product environment (scripts/serve.sh, scripts/demo.sh); use .venv-test" >&2
  exit 2
fi
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$VENV"
LOG="$VENV/install.log"
: >"$LOG"
source scripts/step.sh
PIP=("$VENV/bin/python" -m pip install)

if [[ -x "$VENV/bin/python" ]]; then
  echo "[1/6] $VENV exists"
else
  step "[1/6] creating the virtual environment $VENV" "$PY" -m venv "$VENV"
fi
# The CPU build of torch (CI has no GPU); CHORUS_TORCH_INDEX picks another PyTorch index.
step "[2/6] installing PyTorch, about 200 MB to download the first time" bash scripts/install-torch.sh "$VENV"
# [ray]: the scale-out tests (tests/server/test_scale_out.py) run a local Ray Serve cluster.
# [he], [zh]: the real dicta-onnx and spacy-pkuseg run on tiny models the tests build
# (tests/text/test_language_models.py); nothing is downloaded.
# [livekit]: the LiveKit plugin's tests (tests/integrations) run the real livekit-agents.
# [bench]: matplotlib, for the roofline and TTFA plots' tests (tests/bench/test_roofline.py, test_plot.py).
# [quality]: DNSMOS scores real speech and noise (tests/quality); its onnxruntime is dicta-onnx's.
# [grpc]: the Riva gRPC door, tested with NVIDIA's own client (nvidia-riva-client) and its protos
# rebuilt by grpcio-tools (tests/server/test_grpc*.py).
step "[3/6] installing Chorus with its test tools and extras" \
  "${PIP[@]}" -e ".[test,ray,he,zh,livekit,bench,quality,grpc]" "livekit-agents==1.8.9" \
  "nvidia-riva-client==2.28.0" "grpcio-tools>=1.60,<2"
# The Pipecat plugin's tests: pipecat-ai pins onnxruntime>=1.24.3 (dicta-onnx, above, pins 1.21.1)
# and protobuf<7 (the oracle, below, pins 7.36.2) for parts the plugin does not use (VAD models,
# serializers), so it comes without its dependencies, then those not already here.
pipecat() {
  "${PIP[@]}" --no-deps "pipecat-ai==1.14.0"
  "${PIP[@]}" "loguru~=0.7.3" "loudness>=0.2,<1" "Markdown>=3.7,<4" "resampy~=0.4.3" "wait_for2>=0.4.1,<1" \
      "aiofiles>=24.1,<27" "docstring_parser>=0.16,<1"
}
step "[4/6] installing Pipecat for its plugin's tests" pipecat
# Triton runs the paged-attention kernel tests on the CPU through its interpreter.
step "[5/6] installing Triton (its interpreter runs the kernel tests on the CPU)" "${PIP[@]}" "triton==3.6.0"

# --- the oracle ---------------------------------------------------------------------------
oracle() {
  # torchaudio: only its pure-Python parts (kaldi fbank, Resample) are used by the reference;
  # its compiled library targets another torch release, so it is installed without it.
  "${PIP[@]}" --no-deps torchaudio==2.11.1
  local sp
  sp=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -f "$sp"/torchaudio/lib/*.so
  # The reference pins torch 2.6 and a git-only watermarker, hence --no-deps; s3tokenizer 0.3.0
  # is pinned because 0.2.0 differs numerically; resemble-perth needs pkg_resources (setuptools<82).
  "${PIP[@]}" --no-deps chatterbox-tts==0.1.7 s3tokenizer==0.3.0 resemble-perth==1.0.1
  "${PIP[@]}" -r tests/oracle-requirements.txt "setuptools<82"
}
step "[6/6] installing the reference oracle (chatterbox-tts 0.1.7) for the parity tests" oracle
if grep -q "dependency conflicts" "$LOG"; then  # pip's "ERROR: ... the following dependency conflicts."
  echo "  pip's log lists dependency conflicts (e.g. chatterbox-tts 0.1.7 requires torch==2.6.0): expected;"
  echo "  the oracle and pipecat-ai come without their pinned dependencies on purpose (docs/testing.md)"
fi
echo "test environment ready in $VENV"
