# txbroker: the HTTP service (docs/operations.md, "Docker"). In the container it listens on 0.0.0.0,
# so it requires authentication; TXBROKER_ADMIN_TOKEN bootstraps the super user `admin`:
#   docker build -t txbroker .
#   export TXBROKER_ADMIN_TOKEN=$(openssl rand -hex 32)
#   docker run -d -p 8080:8080 -v txbroker-data:/data -e TXBROKER_AUTH=required -e TXBROKER_ADMIN_TOKEN txbroker
# Without TXBROKER_DATABASE_URL it starts its embedded PostgreSQL in /data (the volume); against a
# PostgreSQL of your own add -e TXBROKER_DATABASE_URL=postgresql://user:pass@db/txbroker.
# A local try without keys, the port published on the host's loopback only (the local-only choice):
#   docker run --rm -p 127.0.0.1:8080:8080 -e TXBROKER_ALLOW_ANONYMOUS=true txbroker
# The Kafka listener (docs/kafka.md) stays on the container's loopback (127.0.0.1:9092) unless
# TXBROKER_KAFKA_LISTENER says otherwise, so 9092 is not exposed; it has no authentication yet, so
# only the local try can use it (docs/operations.md, "Docker"):
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9092:9092 -e TXBROKER_ALLOW_ANONYMOUS=true \
#     -e TXBROKER_KAFKA_LISTENER=0.0.0.0:9092 -e TXBROKER_KAFKA_ADVERTISED_LISTENER=127.0.0.1:9092 txbroker
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
# Both distributions: the client (sdk/: SDK and CLI) and the server, which depends on it.
RUN pip install --no-cache-dir -e ./sdk -e .

# Not root: the embedded PostgreSQL then runs as this user directly (no namespace needed).
USER txbroker
ENV TXBROKER_HOST=0.0.0.0 TXBROKER_DATA_DIR=/data
EXPOSE 8080
VOLUME ["/data"]
# Healthy once /v1/health answers 200 (migrations applied, decided transactions recovered; it needs no
# credentials). Python's urllib, so the image needs no curl; HTTPS when TXBROKER_SSL_CERTFILE is set.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-c", "import os, ssl, urllib.request; tls = bool(os.environ.get('TXBROKER_SSL_CERTFILE')); url = ('https' if tls else 'http') + '://127.0.0.1:' + os.environ.get('TXBROKER_PORT', '8080') + '/v1/health'; urllib.request.urlopen(url, timeout=4, context=ssl._create_unverified_context() if tls else None)"]
CMD ["txbroker", "serve"]
