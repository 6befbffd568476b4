# txbroker: the HTTP service. Against a PostgreSQL of your own (recommended in containers):
#   docker run -p 8080:8080 -e TXBROKER_DATABASE_URL=postgresql://user:pass@db/txbroker txbroker
# Without TXBROKER_DATABASE_URL it starts its embedded PostgreSQL in /data (mount a volume there).
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
CMD ["txbroker", "serve"]
