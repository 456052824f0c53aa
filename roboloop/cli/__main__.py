from roboloop.cli.main import run

run()
