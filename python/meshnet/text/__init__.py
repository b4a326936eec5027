"""Text a model reads and writes: GGUF tokenizers (ours and llama.cpp's) and chat templates."""
