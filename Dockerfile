# Front-end libraries from the npm registry, pinned by package-lock.json (see `make vendor`).
FROM node:20 AS vendor
WORKDIR /src
COPY Makefile package.json package-lock.json ./
RUN make vendor

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY config ./config
COPY knowledge ./knowledge
COPY chat ./chat
RUN pip install .

COPY . .
COPY --from=vendor /src/static/vendor ./static/vendor
RUN SECRET_KEY=build DATABASE_URL=postgres://build@localhost/build python manage.py collectstatic --noinput

# The media folder exists in the image, owned by `app`: a named volume mounted there starts as a
# copy of it, so uploads are writable. (Without it Docker creates the folder, owned by root.)
RUN useradd --create-home app && mkdir -p /app/.data/media && chown -R app:app /app/.data
USER app
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
