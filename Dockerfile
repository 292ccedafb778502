# One image per service, from the workspace lock: docker build --build-arg SERVICE=ingress .
# skaffold.yaml builds all seven (the archiver and the operator too). The image holds only that
# package and the libs it uses. The operator's entry point is kopf (the chart passes `run -m ...`).
FROM python:3.11-slim AS build
ARG SERVICE
RUN pip install --no-cache-dir uv==0.13.9
WORKDIR /src
COPY pyproject.toml uv.lock ./
COPY libs libs
COPY services services
COPY cli cli
COPY spark-jobs spark-jobs
COPY operator operator
RUN uv sync --frozen --no-dev --no-editable --package "relay-${SERVICE}" \
    && if [ "${SERVICE}" = operator ]; then entry=kopf; else entry="relay-${SERVICE}"; fi \
    && ln -s "/src/.venv/bin/${entry}" /src/.venv/bin/relay-entrypoint

FROM python:3.11-slim
COPY --from=build /src/.venv /src/.venv
ENV PATH=/src/.venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["relay-entrypoint"]
