"""Where an Engine comes from: packaged models (`model_store.py`), GGUF files (`gguf.py`,
`gguf_tokenizer.py`), tiny random models (`tiny.py`), precision (`build.py`), the BLAS
preload (`blas.py`); `loader.py` ties them together.
"""
