# txbroker: the HTTP service (docs/operations.md, "Docker"). In the container it listens on 0.0.0.0,
# so it requires authentication; TXBROKER_ADMIN_TOKEN bootstraps the super user `admin`:
#   docker build -t txbroker .
#   export TXBROKER_ADMIN_TOKEN=$(openssl rand -hex 32)
#   docker run -d -p 8080:8080 -v txbroker-data:/data -e TXBROKER_AUTH=required -e TXBROKER_ADMIN_TOKEN txbroker
# Without TXBROKER_DATABASE_URL it starts its embedded PostgreSQL in /data (the volume); against a
# PostgreSQL of your own add -e TXBROKER_DATABASE_URL=postgresql://user:pass@db/txbroker.
# A local try without keys, the port published on the host's loopback only (the local-only choice):
#   docker run --rm -p 127.0.0.1:8080:8080 -e TXBROKER_ALLOW_ANONYMOUS=true txbroker
# The Kafka listener (docs/kafka.md) listens on the container's 0.0.0.0:9092; clients connect to the
# address it advertises, so set it. With auth required it is a SASL listener (SASL/PLAIN: a principal
# and one of its API keys; SASL_SSL with TXBROKER_SSL_CERTFILE/KEYFILE), docs/operations.md "Docker":
#   docker run -d -p 8080:8080 -p 9092:9092 -v txbroker-data:/data -e TXBROKER_AUTH=required \
#     -e TXBROKER_ADMIN_TOKEN -e TXBROKER_KAFKA_ADVERTISED_LISTENER=broker.example.com:9092 txbroker
#   kcat -b broker.example.com:9092 -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN \
#     -X sasl.username=PRINCIPAL -X sasl.password=API_KEY -L
# The local try over Kafka: add -p 127.0.0.1:9092:9092 -e TXBROKER_KAFKA_ADVERTISED_LISTENER=127.0.0.1:9092.
FROM python:3.11-slim-bookworm

# setpriv/unshare (util-linux) and useradd (passwd) are what the embedded PostgreSQL launcher uses.
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux passwd \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 txbroker \
 && mkdir /data && chown txbroker /data

WORKDIR /srv/txbroker
COPY pyproject.toml README.md alembic.ini ./
COPY sdk ./sdk
COPY app ./app
COPY txbroker ./txbroker
COPY spark_client ./spark_client
COPY alembic ./alembic
COPY web ./web
# Both distributions: the client (sdk/: SDK and CLI) and the server, which depends on it. Their
# bytecode compiled here: the user below cannot write __pycache__ beside the sources, and every
# process of every start would compile them again.
RUN pip install --no-cache-dir -e ./sdk -e . \
 && python -m compileall -q app txbroker spark_client alembic

# Not root: the embedded PostgreSQL then runs as this user directly (no namespace needed).
USER txbroker
ENV TXBROKER_HOST=0.0.0.0 TXBROKER_DATA_DIR=/data TXBROKER_KAFKA_LISTENER=0.0.0.0:9092
EXPOSE 8080 9092
VOLUME ["/data"]
# Healthy once /v1/health answers 200 (migrations applied, decided transactions recovered; it needs no
# credentials). Python's urllib, so the image needs no curl; HTTPS when TXBROKER_SSL_CERTFILE is set.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-c", "import os, ssl, urllib.request; tls = bool(os.environ.get('TXBROKER_SSL_CERTFILE')); url = ('https' if tls else 'http') + '://127.0.0.1:' + os.environ.get('TXBROKER_PORT', '8080') + '/v1/health'; urllib.request.urlopen(url, timeout=4, context=ssl._create_unverified_context() if tls else None)"]
CMD ["txbroker", "serve"]
