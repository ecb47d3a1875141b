set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set output 'docs/results/real/fig4.png'
set title 'fig4'
set xlabel 'decode batch size'
set ylabel 'distinct experts per layer per step'
$d0 << EOD
8 6.65051
16 11.7292
32 19.9671
64 31.7054
EOD
$d1 << EOD
8 6.09726
16 10.6872
32 17.955
64 NaN
EOD
$d2 << EOD
8 6.08622
16 10.4263
32 NaN
64 NaN
EOD
plot $d0 using 1:2 with linespoints title 'random', $d1 using 1:2 with linespoints title 'domain', $d2 using 1:2 with linespoints title 'cluster'
