"""A LitServe 0.2.x app serving all-MiniLM-L6-v2 (the shipped weights) with sentence-transformers, the way a
user would write one: ``python litserve_minilm.py --port P [--openai] [--max-batch-size N --batch-timeout S]``.
Plain: ``POST /predict {"input": text}`` -> ``{"embedding": [...]}``; ``--openai``: LitServe's OpenAI
embedding spec at ``POST /v1/embeddings``."""

import argparse

import litserve as ls


class MiniLM(ls.LitAPI):
    def setup(self, device):
        from sentence_transformers import SentenceTransformer

        from tuning.base.assets import embedded_model_dir

        self.model = SentenceTransformer(str(embedded_model_dir()), device="cpu")

    def decode_request(self, request):
        return request["input"]

    def predict(self, texts):
        batch = texts if isinstance(texts, list) else [texts]
        vectors = self.model.encode(batch, normalize_embeddings=True).tolist()
        return vectors if isinstance(texts, list) else vectors[0]

    def encode_response(self, output):
        return {"embedding": output}


class MiniLMOpenAI(MiniLM):
    def decode_request(self, request):
        return request.input

    def predict(self, texts):
        batch = texts if isinstance(texts, list) else [texts]
        return self.model.encode(batch, normalize_embeddings=True).tolist()

    def encode_response(self, output):
        return {"embeddings": output}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--openai", action="store_true")
    p.add_argument("--max-batch-size", type=int, default=1)
    p.add_argument("--batch-timeout", type=float, default=0.0)
    a = p.parse_args()
    if a.openai:
        server = ls.LitServer(MiniLMOpenAI(), spec=ls.OpenAIEmbeddingSpec(), accelerator="cpu", workers_per_device=1)
    else:
        server = ls.LitServer(MiniLM(max_batch_size=a.max_batch_size, batch_timeout=a.batch_timeout), accelerator="cpu",
                              workers_per_device=1)
    server.run(port=a.port, generate_client_file=False)
