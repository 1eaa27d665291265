"""Tiny stand-ins of the language steps' model files, built in the test (no download):

- a spacy-pkuseg model trained by spacy-pkuseg itself on a dozen segmented lines;
- a Dicta ONNX model with Dicta's inputs (``input_ids``, ``attention_mask``, ``token_type_ids``)
  and outputs (``nikud_logits`` over its 29 classes, ``shin_logits`` over 2) that gives every
  Hebrew letter a qamats and every shin the shin dot, plus a character-level tokenizer placed in
  a Hugging Face cache under Dicta's tokenizer repo, where dicta-onnx looks for it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from chorus.text.language_models import DICTA_TOKENIZER_REPO, PKUSEG_DEFAULT_MODEL

QAMATS, SHIN_DOT = "\u05b8", "\u05c1"
HEBREW_LETTERS = [chr(c) for c in range(ord("א"), ord("ת") + 1)]
PKUSEG_CORPUS = ("你好 世界", "我 爱 北京", "今天 天气 很 好", "北京 欢迎 你")


def train_tiny_pkuseg(workdir: Path) -> Path:
    """A spacy-pkuseg model directory (features.msgpack, weights.npz) trained on a tiny corpus."""
    import spacy_pkuseg

    workdir.mkdir(parents=True, exist_ok=True)
    corpus = workdir / "train.txt"
    corpus.write_text("\n".join(PKUSEG_CORPUS * 4) + "\n", encoding="utf-8")  # >= 10 lines for its trainer
    spacy_pkuseg.train(str(corpus), str(corpus), str(workdir / "model"), train_iter=2)
    return workdir / "model"


def install_as_pkuseg_default(model: Path, home: Path) -> Path:
    """Lay ``model`` out as spacy-pkuseg's downloaded default model in ``home`` (its PKUSEG_HOME):
    the unpacked directory and the archive it keeps as the mark of a finished download."""
    shutil.copytree(model, home / PKUSEG_DEFAULT_MODEL)
    (home / f"{PKUSEG_DEFAULT_MODEL}.zip").write_bytes(b"")
    return home / PKUSEG_DEFAULT_MODEL


def write_dicta_tokenizer(hf_home: Path) -> Path:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *HEBREW_LETTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), behavior="isolated")])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    repo = hf_home / "hub" / ("models--" + DICTA_TOKENIZER_REPO.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    path = repo / "snapshots" / commit / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def write_tiny_dicta_onnx(path: Path, vocab_size: int = 4 + len(HEBREW_LETTERS)) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nikud = np.zeros((vocab_size, 29), np.float32)
    nikud[4:, 11] = 1.0  # class 11 of Dicta's nikud classes is qamats; ids >= 4 are letters
    shin = np.zeros((vocab_size, 2), np.float32)
    shin[:, 0] = 1.0  # shin dot, not sin dot
    io = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "length"])
          for name in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("nikud_logits", TensorProto.FLOAT, ["batch", "length", 29]),
               helper.make_tensor_value_info("shin_logits", TensorProto.FLOAT, ["batch", "length", 2])]
    nodes = [
        helper.make_node("Gather", ["nikud_table", "input_ids"], ["nikud"], axis=0),
        helper.make_node("Gather", ["shin_table", "input_ids"], ["shin"], axis=0),
        # the mask and token types enter the graph (as zeros) so that every input is used
        helper.make_node("Add", ["attention_mask", "token_type_ids"], ["both"]),
        helper.make_node("Cast", ["both"], ["both_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["both_f", "last_axis"], ["both_3d"]),
        helper.make_node("Mul", ["both_3d", "zero"], ["nothing"]),
        helper.make_node("Add", ["nikud", "nothing"], ["nikud_logits"]),
        helper.make_node("Add", ["shin", "nothing"], ["shin_logits"]),
    ]
    tables = [numpy_helper.from_array(nikud, "nikud_table"), numpy_helper.from_array(shin, "shin_table"),
              numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
              numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    model = helper.make_model(helper.make_graph(nodes, "tiny_dicta", io, outputs, tables),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime 1.21 reads
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def diacritized(text: str) -> str:
    """What the tiny Dicta model makes of ``text``."""
    return "".join(c + (SHIN_DOT if c == "ש" else "") + QAMATS if c in HEBREW_LETTERS else c for c in text)
