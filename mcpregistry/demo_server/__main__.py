from mcpregistry.demo_server.server import main

main()
