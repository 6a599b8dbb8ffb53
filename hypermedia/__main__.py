from hypermedia.cli.main import main

main()
