from hypermedia.cli.main import app

app()
