"""A tiny KerasHub BERT text classifier with its tokenizer, saved as a preset folder (random weights, offline)."""

from __future__ import annotations

from pathlib import Path

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "a", "dog", "ran", "fine", "film"]


def save_bert_preset(folder: Path) -> Path:
    """Write the preset (what ``task.save_to_preset(folder)`` writes) and return its folder."""
    import keras_hub

    tokenizer = keras_hub.models.BertTokenizer(vocabulary=VOCABULARY, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=len(VOCABULARY), num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
    keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=preprocessor).save_to_preset(
        str(folder))
    return folder
