# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3

.PHONY: install install-tests demo test

install:
	$(PYTHON) tools/bootstrap.py

install-tests:
	$(PYTHON) tools/bootstrap.py --extras tests,mim

demo: install
	$(PYTHON) tools/run_demo.py

test: install-tests
	$(PYTHON) -m pytest -n 2 --dist loadgroup tests
