// A block of includes and declarations at namespace scope, over TCP (compiled only: its globals
// would connect when run).
// links: dtrain::asio
// needs: asio
// @block@
